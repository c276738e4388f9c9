"""A local RPC farm for tests: an RPC tracker and RPC servers started and stopped on this
machine (like MetaSchedule's `testing/local_rpc.py`).

Every process runs in its own session (`start_new_session=True`) and is stopped by killing its
process group: TVM's `rpc_tracker`/`rpc_server` launchers do their work in a `popen_worker`
child, which a signal to the launcher alone would orphan, still listening and re-registering
with the tracker (TVM_NOTES §7). Servers get `TVM_NUM_THREADS`, so kernels use the threads the
measurement asks for instead of TVM's default of half the cores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
LOOPBACK_KEY = "loopback"  # the device key of the tests' boards
# starts a board otherwise: (tracker address, port, log directory) -> its process
ServerStart = Callable[[tuple[str, int], int, Path], "subprocess.Popen[bytes]"]


@dataclass
class FarmProcess:
    """A tracker or server process (the leader of its own process group)."""

    role: str  # "tracker" or "server:<key>"
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (launcher and its popen_worker) and reap the leader."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):  # pragma: no cover
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _spawn(role: str, args: list[str], host: str, port: int, *, log_dir: Path | None,
           env: dict[str, str]) -> FarmProcess:
    log_path = log_dir / f"{role.replace(':', '-')}-{port}.log" if log_dir else None
    out: IO[bytes] | None = open(log_path, "ab") if log_path else None  # noqa: SIM115 - kill()
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], stdin=subprocess.DEVNULL,
        stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT,
        env=env, start_new_session=True,
    )
    log.debug("started %s on %s:%d (pid %d)", role, host, port, proc.pid)
    return FarmProcess(role, host, port, proc, log_path, out)


def _wait_listening(fp: FarmProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not fp.alive():
            raise RuntimeError(f"{fp.role} on port {fp.port} exited with code {fp.proc.returncode}")
        try:
            with socket.create_connection(fp.address, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    fp.kill()
    raise TimeoutError(f"{fp.role} did not listen on {fp.host}:{fp.port} within {timeout_s:g} s")


def start_tracker(host: str = "127.0.0.1", port: int | None = None, *,
                  log_dir: Path | None = None, timeout_s: float = START_TIMEOUT_S) -> FarmProcess:
    """`python -m tvm.exec.rpc_tracker` on `host:port` (a free port by default); returns once it
    listens."""
    port = port or free_port(host)
    fp = _spawn("tracker", ["tvm.exec.rpc_tracker", "--host", host, "--port", str(port),
                            "--port-end", str(port + 1), "--silent"],
                host, port, log_dir=log_dir, env=dict(os.environ))
    _wait_listening(fp, timeout_s)
    return fp


def start_server(tracker: tuple[str, int], key: str, *, host: str = "127.0.0.1",
                 port: int | None = None, num_threads: int = 1,
                 log_dir: Path | None = None) -> FarmProcess:
    """`python -m tvm.exec.rpc_server` registered with `tracker` under `key`, with
    TVM_NUM_THREADS=`num_threads`. Does not wait: see `wait_for_servers`."""
    port = port or free_port(host)
    env = dict(os.environ, TVM_NUM_THREADS=str(num_threads))
    return _spawn(f"server:{key}", [
        "tvm.exec.rpc_server", "--host", host, "--port", str(port), "--port-end", str(port + 1),
        "--tracker", f"{tracker[0]}:{tracker[1]}", "--key", key, "--silent"],
        host, port, log_dir=log_dir, env=env)


def registered_servers(tracker: tuple[str, int], key: str) -> int:
    """How many servers the tracker lists for `key` (busy or free)."""
    from tuner.core import tvm_api as tv

    info = tv.rpc_tracker_summary(*tracker).get("server_info", [])
    return sum(1 for s in info if s.get("key") == f"server:{key}")


def wait_for_servers(tracker: tuple[str, int], key: str, count: int, *,
                     timeout_s: float = START_TIMEOUT_S) -> None:
    """Block until the tracker lists `count` servers for `key` and has `count` of them free."""
    from tuner.core import tvm_api as tv

    deadline = time.monotonic() + timeout_s
    while True:
        summary = tv.rpc_tracker_summary(*tracker)
        listed = sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{key}")
        free = summary.get("queue_info", {}).get(key, {}).get("free", 0)
        if listed >= count and free >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the tracker lists {listed} server(s) ({free} free) for key "
                               f"{key!r} after {timeout_s:g} s; wanted {count}")
        time.sleep(0.2)


class LocalRpcFarm:
    """A tracker and `servers` RPC servers of one key on this machine; a context manager that
    kills every process group on exit.

        with LocalRpcFarm("zen5", servers=2, num_threads=1) as farm:
            RpcMeasurer(*farm.tracker_address, "zen5")
    """

    def __init__(self, key: str, *, servers: int = 1, num_threads: int = 1,
                 host: str = "127.0.0.1", log_dir: Path | None = None,
                 timeout_s: float = START_TIMEOUT_S, server: ServerStart | None = None) -> None:
        """`server`: starts one board otherwise than as this machine's `rpc_server` (an
        emulated board: workers/board.py), given the tracker's address, a port and the log
        directory."""
        self.key = key
        self._start_server = server
        self.timeout_s = timeout_s
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tunefarm-rpcfarm-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tracker: FarmProcess | None = None
        self.servers: list[FarmProcess] = []
        try:
            self.tracker = start_tracker(host, log_dir=self.log_dir, timeout_s=timeout_s)
            for _ in range(servers):
                self.add_server(num_threads=num_threads, wait=False)
            wait_for_servers(self.tracker_address, key, servers, timeout_s=timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def tracker_address(self) -> tuple[str, int]:
        assert self.tracker is not None
        return self.tracker.address

    def add_server(self, *, num_threads: int = 1, wait: bool = True) -> FarmProcess:
        assert self.tracker is not None
        if self._start_server is None:
            fp = start_server(self.tracker_address, self.key, host=self.tracker.host,
                              num_threads=num_threads, log_dir=self.log_dir)
        else:
            port = free_port(self.tracker.host)
            fp = FarmProcess(f"server:{self.key}", self.tracker.host, port,
                             self._start_server(self.tracker_address, port, self.log_dir))
        self.servers.append(fp)
        if wait:
            wait_for_servers(self.tracker_address, self.key, len(self.live_servers()),
                             timeout_s=self.timeout_s)
        return fp

    def live_servers(self) -> list[FarmProcess]:
        return [s for s in self.servers if s.alive()]

    def server_at(self, port: int) -> FarmProcess | None:
        return next((s for s in self.servers if s.port == port), None)

    def close(self) -> None:
        for fp in [*self.servers, *([self.tracker] if self.tracker else [])]:
            fp.kill()
        if self._own_log_dir:
            import shutil

            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalRpcFarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
