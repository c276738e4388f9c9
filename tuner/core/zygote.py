"""A fork server for lean children: each process that starts children (the tuner's sandbox and build
processes, the API's TVMScript parsers) starts a server per scheduling class (the parsers' server
in the idle class, as they are), which imports TVM and the children's modules once; every child
is then a fork of it instead of a new interpreter that imports them again (0.7-0.8 s of CPU each,
measured on a 2-core Xeon and Zen 4; the suite starts about 350 children).

    popen("tuner.measure.sandbox", str(fd), limits=..., stdin=PIPE, pass_fds=(fd,), env=...)

returns a `subprocess.Popen` whatever starts it: a `ZygotePopen` when the server runs, else a
plain `Popen` of `lean.argv(...)` (setting `fork_server` off, a platform without fork, or a
server that failed). The child is what `python -m tuner.core.lean MODULE ARGS` would be:

- the server is started like any untrusted child, with `child_env()` (no credential in its
  environment or its memory: it only imports modules) and from the project's root; it never
  reads anything but its client's requests, on a socket pair only the client holds;
- a child forked from it gets the client's descriptors at the same numbers (stdin, stdout,
  stderr, `pass_fds`; nothing else stays open), its environment, its working directory, a
  session of its own, the `limits` (what `limits.preexec()` does after a fork: rlimits, no
  network, no root) and, with `idle`, the idle scheduling class, before the module runs;
- the server reaps its children and reports each exit status to the client, so `poll`,
  `wait`, `communicate`, `kill` and `returncode` behave as for a child of the client itself;
  the server exits when its client closes the socket (the client's exit included).

The server forks from one thread and has run no kernel and parsed no text: every child starts
from the same clean, imported state.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from . import lean

# what the children import, loaded once in the server
PRELOAD = ("tuner.core.tvm_api", "tvm.exec.popen_worker",
           "schedules.registry", "tuner.workloads", "tuner.workloads.parse_child",
           "tuner.measure.sandbox", "tuner.measure.builder")
MODULE = "tuner.core.zygote"
MAX_REQUEST = 1 << 20  # bytes of one request (argv, environment)
START_TIMEOUT_S = 120.0
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_KILLED = signal.SIGKILL.value  # a wait status: killed by SIGKILL


class _Server:
    """The client's handle on a fork server: one per process and scheduling class, started on
    first use; `idle`: in the idle class from its first import, as its children are."""

    def __init__(self, idle: bool = False) -> None:
        from .isolation import child_env

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            lean.argv(MODULE, str(theirs.fileno()), idle=idle), pass_fds=(theirs.fileno(),),
            env=child_env({"PYTHONPATH": path}), cwd=_ROOT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        try:
            ours.settimeout(START_TIMEOUT_S)
            if ours.recv(64) != b"ready":
                raise OSError("the fork server did not start")
            ours.settimeout(None)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def spawn(self, request: dict[str, Any], fds: list[int]
              ) -> tuple[int, socket.socket, bytes]:
        """Fork a child for `request` with `fds` at `request["targets"]`; (its pid, the socket
        its exit status comes on, what came on it after the pid: a quick child's status)."""
        mine, report = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.sock, [json.dumps(request).encode()],
                                [report.fileno(), *fds])
            report.close()
            mine.settimeout(START_TIMEOUT_S)
            line, rest = _read_line(mine)
            mine.settimeout(None)
            reply = json.loads(line) if line else {}
            if "pid" not in reply:
                raise OSError(f"the fork server could not start the child: "
                              f"{reply.get('error', 'no reply')}")
            return int(reply["pid"]), mine, rest
        except BaseException:
            mine.close()
            raise


_servers: dict[bool, _Server] = {}  # by idle class
_failed: set[bool] = set()
_start_lock = threading.Lock()


def _get_server(idle: bool = False) -> _Server | None:
    """This process's fork server of the class `idle` (started now if it has none running);
    None where one failed to start."""
    with _start_lock:
        server = _servers.get(idle)
        if server is not None and server.proc.poll() is None:
            return server
        if idle in _failed:
            return None
        try:
            _servers[idle] = server = _Server(idle)
        except OSError:
            _failed.add(idle)  # plain children of this class from now on
            _servers.pop(idle, None)
            return None
        return server


def prestart(idle: bool = False) -> None:
    """Start this process's fork server of the class `idle` now, where it is enabled: a
    service does it at start-up, so that its first child does not wait for the server's
    imports (nor do the requests it serves meanwhile)."""
    if enabled():
        _get_server(idle)


def enabled() -> bool:
    from .config import get_settings

    return bool(get_settings().fork_server) and hasattr(os, "fork") and sys.platform == "linux"


def popen(module: str, *args: str, idle: bool = False, limits: Any = None,
          **kwargs: Any) -> subprocess.Popen[Any]:
    """`module` (with `args`) as a lean child, from the fork server when there is one. `limits`
    (a `tuner.core.isolation.Limits`) are applied in the child as `limits.preexec()` would;
    `kwargs` are `subprocess.Popen`'s (not `preexec_fn`, `executable` or `shell`)."""
    assert not {"preexec_fn", "executable", "shell"} & set(kwargs), kwargs
    if enabled() and (server := _get_server(idle)) is not None:
        try:
            return ZygotePopen(server, module, list(args), idle=idle, limits=limits, **kwargs)
        except OSError:  # the server broke: this child is spawned, the next gets a new server
            server.close()
    if limits is not None:
        kwargs["preexec_fn"] = limits.preexec()
    return subprocess.Popen(lean.argv(module, *args, idle=idle), **kwargs)


class ZygotePopen(subprocess.Popen):  # type: ignore[type-arg]
    """A `subprocess.Popen` whose child is forked by the fork server: the same pipes and
    methods; the exit status comes from the server."""

    def __init__(self, server: _Server, module: str, args: list[str], *, idle: bool,
                 limits: Any, **kwargs: Any) -> None:
        self._server = server
        self._request = {"module": module, "args": args, "idle": idle,
                         "limits": limits.as_json() if limits is not None else None}
        self._report: socket.socket | None = None
        self._rbuf = b""
        super().__init__(lean.argv(module, *args, idle=idle), **kwargs)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any, creationflags: Any,
                       shell: Any, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int,
                       errread: int, errwrite: int, *rest: Any) -> None:
        start_new_session = rest[-2] if len(rest) >= 2 else False
        fds, targets = [], []
        for fd, target in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)):
            fds.append(fd if fd != -1 else target)  # not redirected: this process's own
            targets.append(target)
        for fd in pass_fds:
            fds.append(int(fd))
            targets.append(int(fd))
        request = {**self._request, "targets": targets, "session": bool(start_new_session),
                   "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                   "env": dict(env) if env is not None else dict(os.environ)}
        base: Any = self  # Popen's private helpers, as its own _execute_child uses them
        try:
            self.pid, self._report, self._rbuf = self._server.spawn(request, fds)
            self._child_created = True
        finally:
            base._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _status(self, block: bool) -> int | None:
        """The child's wait status from the server, None while it runs (when not `block`)."""
        report = self._report
        if report is None:
            return 0
        while b"\n" not in self._rbuf:
            report.setblocking(block)
            try:
                chunk = report.recv(4096)
            except BlockingIOError:
                return None
            except OSError:
                chunk = b""
            if not chunk:  # the server is gone: the child is killed, if it still runs
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
                self._rbuf += b'{"status": %d}\n' % _KILLED
                break
            self._rbuf += chunk
        line, self._rbuf = self._rbuf.split(b"\n", 1)
        report.close()
        self._report = None
        return int(json.loads(line)["status"])

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        sts = self._status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if sts is None else (self.pid, sts)

    def _internal_poll(self, _deadstate: int | None = None, *_: Any) -> int | None:
        """Popen's poll (also what its __del__ and cleanup call), with the server's status."""
        base: Any = self
        if self.returncode is None:
            if not base._waitpid_lock.acquire(False):
                return None
            try:
                if self.returncode is None:
                    pid, sts = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        base._handle_exitstatus(sts)
            finally:
                base._waitpid_lock.release()
        return self.returncode


def _read_line(sock: socket.socket) -> tuple[bytes, bytes]:
    """(The first line, what came after it); (b"", ...) at the end of the stream."""
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            return b"", buf
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return line, rest


# --- the server -----------------------------------------------------------------------------


def serve(fd: int) -> None:
    """(In the server.) Import the children's modules, then fork a child per request until the
    client closes the socket."""
    import importlib

    ctl = socket.socket(fileno=fd)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    reports: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    ctl.sendall(b"ready")
    while True:
        for key, _ in sel.select():
            if key.fileobj is ctl:
                try:
                    msg, fds, _flags, _ = socket.recv_fds(ctl, MAX_REQUEST, 256)
                except OSError:
                    msg, fds = b"", []
                if not msg:
                    return  # the client is gone
                _fork(msg, fds, reports, (fd, wake_r, wake_w))
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
        _reap(reports)


def _fork(msg: bytes, fds: list[int], reports: dict[int, socket.socket],
          own: tuple[int, ...]) -> None:
    if not fds:  # no socket to answer on: not a request of ours
        return
    report = socket.socket(fileno=fds[0])
    ready: tuple[int, ...] = ()
    try:
        request = json.loads(msg)
        if len(request["targets"]) != len(fds) - 1:
            raise ValueError("descriptors and targets differ")
        ready = ready_r, ready_w = os.pipe()
        pid = os.fork()
    except Exception as exc:  # a malformed request or no fork: the client falls back
        for f in ready:
            os.close(f)
        with contextlib.suppress(OSError):
            report.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        report.close()
        for f in fds[1:]:
            os.close(f)
        return
    if pid == 0:
        os.close(ready_r)
        _child(request, fds[1:], own, ready_w)  # never returns
    os.close(ready_w)
    for f in fds[1:]:
        os.close(f)
    # the pid goes back once the child has its session, limits and descriptors (or died):
    # whatever the client then does to its process group reaches it
    with contextlib.suppress(OSError):
        select.select([ready_r], [], [], START_TIMEOUT_S)
    os.close(ready_r)
    try:
        report.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        reports[pid] = report
    except OSError:  # the client went away meanwhile
        report.close()


def _reap(reports: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, sts = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        report = reports.pop(pid, None)
        if report is not None:
            with contextlib.suppress(OSError):
                report.sendall(json.dumps({"status": sts}).encode() + b"\n")
            report.close()


def _child(request: dict[str, Any], fds: list[int], own: tuple[int, ...],
           ready_w: int) -> None:
    """(In a forked child.) Become `python -m tuner.core.lean MODULE ARGS` as the client asked;
    closes `ready_w` once it has its descriptors, session and limits; exits, never returns."""
    code: int = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        targets = [int(t) for t in request["targets"]]
        # the received descriptors (and the ready pipe) out of the way of the targets, then
        # the received ones onto them
        floor = max([*targets, *fds, *own, ready_w]) + 1
        ready = fcntl.fcntl(ready_w, fcntl.F_DUPFD_CLOEXEC, floor)
        high = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, floor) for f in fds]
        for h, t in zip(high, targets, strict=True):
            os.dup2(h, t, inheritable=True)
        keep = sorted({*targets, ready})
        last = 0
        for t in keep:  # nothing else stays open: the server's socket, the other clients' ...
            if last < t:  # (an empty range closes more than nothing on Python 3.11)
                os.closerange(last, t)
            last = t + 1
        os.closerange(last, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        # the module path of `python -m` started here: the working directory first, then the
        # environment's PYTHONPATH (the server's own entries stay after them)
        path = [os.getcwd(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p)]
        sys.path[:] = [*dict.fromkeys([*path, *sys.path[1:]])]
        if request.get("limits"):
            from .isolation import Limits

            Limits.from_json(request["limits"]).preexec()()  # own session, rlimits, no root
        elif request.get("session"):
            os.setsid()
        os.close(ready)  # the server may answer the client now
        import tempfile

        tempfile.tempdir = None  # TMPDIR as the child's environment says
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                      line_buffering=True, write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                      line_buffering=True, write_through=True)
        if request.get("idle"):
            lean.enter_idle_class()
        module = str(request["module"])
        sys.modules.pop(module, None)  # preloaded: run afresh as __main__
        code = lean.run(module, [str(a) for a in request["args"]])
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # what Python prints for an uncaught exception, then status 1
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(int(sys.argv[1]))
