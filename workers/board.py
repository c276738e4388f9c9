"""An emulated aarch64 board: TVM's own RPC server as an aarch64 process under qemu-user, in an
arm64 Debian root, registered with an RPC tracker like any board (`tunefarm board up`).

The root is built once and kept in the data directory (`<data_dir>/boards/qemu-aarch64/root`,
about 400 MB): `debootstrap` of Debian 12 for arm64 (Python 3.11, and gcc: the RPC server links
the `.tar` a worker uploads into a shared library on the board, as on a real board), then TVM's
published aarch64 wheels and numpy, unpacked by this machine's pip into `/opt/tunefarm/site`.
The kernel runs the root's aarch64 programs through binfmt_misc and `qemu-aarch64` (the
`qemu-user-static` package); `ensure_binfmt` mounts binfmt_misc and registers the interpreter
where they are missing. Building and starting need root (debootstrap, chroot).

Timings on it are emulation's: they say nothing about a real board, and the device key is
declared emulated (`Settings.emulated_keys`, default `qemu-aarch64`): its deadlines are scaled,
its latencies are shown as emulated and the farm's cost model never trains on them. What the
board does prove is that a kernel compiled for aarch64 (NEON, `sdot`, `usdot` with +i8mm: qemu
emulates them all; the server runs with `-cpu max`) computes the right answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.core.errors import TunefarmError

log = logging.getLogger(__name__)

KEY = "qemu-aarch64"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
PACKAGES = ("python3", "gcc", "libc6-dev")
WHEELS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy==2.4.6",
          "ml_dtypes==0.7.0", "typing_extensions==4.16.0", "psutil==7.2.2", "cloudpickle==3.1.3")
SITE = "/opt/tunefarm/site"  # inside the root
BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")  # from qemu-user-static
START_TIMEOUT_S = 120.0  # an emulated Python imports TVM in 10-40 s


class BoardError(TunefarmError):
    """The emulated board cannot be built or started (what is missing, and how to get it)."""


def board_dir(data_dir: Path) -> Path:
    return Path(os.environ.get("TUNEFARM_BOARD_DIR") or data_dir / "boards" / KEY)


def _recipe() -> str:
    """What a root is built from: a root built from another recipe is rebuilt."""
    return json.dumps({"suite": SUITE, "packages": PACKAGES, "wheels": WHEELS})


def is_built(directory: Path) -> bool:
    marker = directory / "root" / ".tunefarm-board"
    return marker.is_file() and marker.read_text() == _recipe()


def ensure_binfmt() -> None:
    """Make the kernel run aarch64 programs through qemu-aarch64: mount binfmt_misc and register
    qemu-user-static's interpreter (flag F: opened now, so it works inside the chroot too)."""
    if not (BINFMT / "register").exists():
        try:
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)],
                           check=True, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BoardError(f"cannot mount binfmt_misc at {BINFMT} ({exc}): run as root") from exc
    if (BINFMT / "qemu-aarch64").exists():
        return
    if not BINFMT_CONF.is_file():
        raise BoardError(f"{BINFMT_CONF} is missing: apt-get install qemu-user-static")
    try:
        (BINFMT / "register").write_text(BINFMT_CONF.read_text().strip() + "\n")
    except OSError as exc:
        raise BoardError(f"cannot register qemu-aarch64 with binfmt_misc ({exc}): "
                         "run as root") from exc


def _need(tool: str, package: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if path is None:
        raise BoardError(f"{tool} is missing: apt-get install {package}")
    return path


def build(directory: Path, *, pip: list[str], say: Callable[[str], None] = log.info) -> Path:
    """The board's root (built once, then reused): its path. `pip` runs this machine's pip."""
    root = directory / "root"
    if is_built(directory):
        return root
    if os.geteuid() != 0:
        raise BoardError("building the board's root needs root (debootstrap, chroot)")
    debootstrap = _need("debootstrap", "debootstrap")
    ensure_binfmt()
    partial = directory / "root.partial"
    shutil.rmtree(partial, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {SUITE} arm64 into {partial} (a few minutes: its second stage runs "
        "under emulation)")
    _run([debootstrap, "--arch=arm64", "--variant=minbase", f"--include={','.join(PACKAGES)}",
          SUITE, str(partial), MIRROR], directory / "debootstrap.log", timeout_s=3600)
    say(f"TVM's aarch64 wheels into {SITE}")
    _run([*pip, "install", "--quiet", "--no-deps", "--only-binary=:all:",
          "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11",
          "--implementation", "cp", "--target", str(partial / SITE.lstrip("/")), *WHEELS],
         directory / "pip.log", timeout_s=1800)
    (partial / ".tunefarm-board").write_text(_recipe())
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return root


def _run(cmd: list[str], log_path: Path, *, timeout_s: float) -> None:
    with open(log_path, "wb") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise BoardError(f"{cmd[0]} did not finish within {timeout_s:g} s "
                             f"(log: {log_path})") from exc
    if proc.returncode:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise BoardError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}; log: {log_path}):"
                         f" {' / '.join(tail)}")


def server_command(root: Path, tracker: tuple[str, int], port: int, *, key: str = KEY,
                   host: str = "127.0.0.1") -> list[str]:
    """TVM's RPC server in the root: an aarch64 Python under qemu (QEMU_CPU=max: every
    extension qemu emulates, SVE and i8mm included), one thread per kernel."""
    return ["chroot", str(root), "/usr/bin/env", "-i", f"PYTHONPATH={SITE}", "HOME=/tmp",
            "PATH=/usr/bin:/bin", "QEMU_CPU=max", "TVM_NUM_THREADS=1",
            "python3", "-m", "tvm.exec.rpc_server", "--host", host, "--port", str(port),
            "--port-end", str(port + 1), "--tracker", f"{tracker[0]}:{tracker[1]}",
            "--key", key, "--silent"]


def start_server(root: Path, tracker: tuple[str, int], port: int, log_path: Path, *,
                 key: str = KEY) -> subprocess.Popen[bytes]:
    """One emulated board (its own process group: `stop` kills the server and its forks)."""
    ensure_binfmt()
    with open(log_path, "ab") as out:
        return subprocess.Popen(server_command(root, tracker, port, key=key),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def start_tracker(directory: Path, address: tuple[str, int]) -> subprocess.Popen[bytes]:
    """TVM's RPC tracker on `address` (its own process group, its log in `directory`)."""
    with open(directory / "tracker.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", address[0], "--port",
             str(address[1]), "--port-end", str(address[1] + 1), "--silent"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_registered(tracker: tuple[str, int], key: str, count: int,
                    procs: list[subprocess.Popen[bytes]], timeout_s: float = START_TIMEOUT_S
                    ) -> None:
    """Until the tracker lists `count` free servers of `key`; a server that exits is an error."""
    from tuner.core import tvm_api as tv

    deadline = time.monotonic() + timeout_s
    while True:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise BoardError(f"an emulated board exited with code {dead[0].returncode} before "
                             "registering (see its log)")
        with contextlib.suppress(OSError, ValueError):
            free = tv.rpc_tracker_summary(*tracker).get("queue_info", {}).get(key, {})
            if free.get("free", 0) >= count:
                return
        if time.monotonic() > deadline:
            raise BoardError(f"{count} board(s) did not register with the tracker "
                             f"{tracker[0]}:{tracker[1]} within {timeout_s:g} s")
        time.sleep(1.0)


# -- the processes `tunefarm board up` started, kept in <dir>/processes.json for `down` ------------

def _registry(directory: Path) -> Path:
    return directory / "processes.json"


def started(directory: Path) -> list[dict[str, Any]]:
    """What `up` started and `down` has not stopped: {role, pid, port} each."""
    path = _registry(directory)
    return list(json.loads(path.read_text())) if path.is_file() else []


def remember(directory: Path, entries: list[dict[str, Any]]) -> None:
    _registry(directory).write_text(json.dumps(started(directory) + entries))


def stop_all(directory: Path) -> int:
    """Stop every process `up` started (each one's process group); how many were running."""
    stopped = 0
    for entry in started(directory):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(entry["pid"]), signal.SIGKILL)
            stopped += 1
    _registry(directory).unlink(missing_ok=True)
    return stopped
