"""`tunefarm board up|down|status`: an emulated aarch64 board (workers/board.py) on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import console, fail, host_port
from tuner.core.config import get_settings
from tuner.core.errors import TunefarmError

TrackerOpt = Annotated[str | None, typer.Option(
    help="HOST:PORT of the RPC tracker to register with (default: start one on "
         "127.0.0.1:9190).")]
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def _build(directory: Path) -> Path:
    """The board's root in `directory`, built now with this Python's pip if it is not yet."""
    from workers import board

    return board.build(directory, pip=[sys.executable, "-m", "pip"], say=console.print)


def board_up(
    count: Annotated[int, typer.Option(min=1, max=8, help="Boards to start.")] = 1,
    tracker: TrackerOpt = None,
    key: Annotated[str, typer.Option(help="Device key they register under.")] = "qemu-aarch64",
) -> None:
    """Start emulated aarch64 boards (TVM's RPC server under qemu-user in an arm64 Debian
    root, built on first use in the data directory); `board down` stops them. Their timings
    say nothing about a real board; their verification does. Needs root."""
    from workers import board

    directory = board.board_dir(get_settings().data_dir)
    try:
        root = _build(directory)
        if tracker:
            address = host_port(tracker)
        else:
            address = ("127.0.0.1", 9190)
            proc = board.start_tracker(directory, address)
            board.remember(directory, [{"role": "tracker", "pid": proc.pid, "port": address[1]}])
        procs = []
        for _ in range(count):
            port = board.free_port()
            procs.append(board.start_server(root, address, port,
                                            directory / f"board-{port}.log", key=key))
            board.remember(directory, [{"role": f"board:{key}", "pid": procs[-1].pid,
                                        "port": port}])
        console.print(f"waiting for {count} board(s) to register (an emulated Python imports "
                      "TVM in 10-40 s)")
        board.wait_registered(address, key, count, procs)
    except TunefarmError as exc:
        fail(exc)
    where = f"{address[0]}:{address[1]}"
    console.print(f"{count} emulated {key} board(s) registered with {where}\n"
                  f"  tunefarm tune dense --shape 64,256,128 --target '{json.dumps(AARCH64)}' "
                  f"--device-key {key} --rpc-tracker {where} --trials 16\n"
                  f"  tunefarm worker --device-key {key} --rpc-tracker {where} --target "
                  f"'{json.dumps(AARCH64)}'   (a farm worker)\n"
                  "Timings are emulation's: they say nothing about a real board.", style="green")


def board_build() -> None:
    """Build the emulated board's arm64 root now (once; `board up` builds it on first use):
    debootstrap of Debian 12 for arm64 and TVM's aarch64 wheels, a few minutes. Needs root,
    debootstrap and qemu-user-static."""
    from workers import board

    directory = board.board_dir(get_settings().data_dir)
    try:
        root = _build(directory)
    except TunefarmError as exc:
        fail(exc)
    console.print(f"the board's root is ready: {root}", style="green")


def board_down() -> None:
    """Stop every process `board up` started (boards and its tracker)."""
    from workers import board

    n = board.stop_all(board.board_dir(get_settings().data_dir))
    console.print(f"stopped {n} process(es)")


def board_status() -> None:
    """Whether the board's root is built, and what `board up` started."""
    from workers import board

    directory = board.board_dir(get_settings().data_dir)
    built = "built" if board.is_built(directory) else "not built"
    console.print(f"root: {directory / 'root'} ({built})")
    for e in board.started(directory):
        console.print(f"  {e['role']}  pid {e['pid']}  port {e['port']}")
