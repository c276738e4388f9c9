"""Local measurement: this machine is the board.

`LocalMeasurer` keeps one sandbox child (`tuner.measure.sandbox`) alive across candidates and
enforces the protocol's deadlines per phase: the build deadline covers replay + compile, the run
deadline covers warm-up, verification and timing. A child that dies (segfaulting kernel) or misses a
deadline (hanging kernel, runaway compile) is killed by process group and replaced; the candidate
is recorded with the matching invalidity and the next candidate runs in a fresh child.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.core import zygote
from tuner.core.isolation import Limits, child_env
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from tuner.measure.builder import Built, Prebuilder

log = logging.getLogger(__name__)

PREPARE_TIMEOUT_S = 600.0  # reference outputs of a new workload (numpy / naive TVM build)
START_TIMEOUT_S = 120.0
SEND_TIMEOUT_S = 120.0  # parsing the workload spec in the child


class _ChildDied(Exception):
    pass


class _Deadline(Exception):
    pass


class _Child:
    """One sandbox process and its response pipe. It starts in the background (forked by the fork
    server, milliseconds; spawned, it imports TVM first, ~1 s); `wait_ready` waits for it."""

    def __init__(self, num_threads: int, log_path: Path) -> None:
        limits = Limits.from_settings()
        # the child's own scratch directory (its compiles' temporary files, HOME), writable by the
        # unprivileged user it drops to
        self.tmp = tempfile.mkdtemp(prefix="tunefarm-sandbox-tmp-")
        ids = limits.drop_ids()
        if ids is not None:
            os.chown(self.tmp, *ids)
        env = child_env({"TVM_NUM_THREADS": str(num_threads), "PYTHONUNBUFFERED": "1",
                         "TMPDIR": self.tmp, "HOME": self.tmp})
        r_fd, w_fd = os.pipe()
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in kill()
        args = [str(w_fd)]
        if ids is not None and not limits.can_exec(sys.executable):
            # the unprivileged user cannot run this interpreter: the child drops itself to it
            # once its imports are done, before it reads any candidate
            args.append(f"--drop={limits.user}")
            start = limits.keep_root()
        else:
            start = limits
        # in the child: a new session (kill() kills the group), rlimits, then no root
        self.proc = zygote.popen(
            "tuner.measure.sandbox", *args, limits=start, stdin=subprocess.PIPE,
            stdout=self._log, stderr=self._log, pass_fds=(w_fd,), env=env, cwd=os.getcwd())
        os.close(w_fd)
        self.num_threads = num_threads
        self._r = r_fd
        os.set_blocking(r_fd, False)
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(r_fd, selectors.EVENT_READ)
        self.ready = False

    def wait_ready(self) -> None:
        if not self.ready:
            self.read(START_TIMEOUT_S)  # {"phase": "ready"}
            self.ready = True

    def send(self, inp: MeasureInput) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(inp.to_json().encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _ChildDied(str(exc)) from exc

    def read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline()
            if not self._sel.select(timeout=left):
                continue
            chunk = os.read(self._r, 65536)
            if not chunk:
                raise _ChildDied(self.exit_reason())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the measuring process closed its pipe"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the measuring process was killed by {name}"
        return f"the measuring process exited with code {code}"

    def log_tail(self, n: int = 1500) -> str:
        try:
            data = self.log_path.read_bytes()[-n:]
        except OSError:
            return ""
        lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-5:])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # pragma: no cover
            self.proc.wait(timeout=10)
        self._sel.close()
        for closer in (lambda: os.close(self._r), self._log.close):
            with contextlib.suppress(OSError):
                closer()
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalMeasurer(Measurer):
    """Measures candidates one at a time in a sandbox child; never raises for a bad kernel."""

    def __init__(self, *, worker_id: str | None = None, log_dir: Path | None = None,
                 build_workers: int | None = None) -> None:
        """`build_workers`: processes that build a prepared batch in parallel (default: one per
        core; 0 builds each candidate in the sandbox, serially)."""
        from tuner.core.config import get_settings, physical_cores

        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:local"
        n = physical_cores() if build_workers is None else build_workers
        self._prebuilder = Prebuilder(n) if n > 0 else None
        if self._prebuilder is not None:
            self._prebuilder.warm(get_settings().build_timeout_s)
        self._built: dict[str, Built] = {}
        self._own_log_dir = log_dir is None
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tunefarm-sandbox-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._child: _Child | None = None
        self.restarts = 0

    def _start_child(self, num_threads: int) -> _Child:
        """The sandbox process for `num_threads`, started if needed (not waited for)."""
        if self._child is not None and (not self._child.alive()
                                        or self._child.num_threads != num_threads):
            self._child.kill()
            self._child = None
        if self._child is None:
            self._child = _Child(num_threads, self._log_dir / "sandbox.log")
        return self._child

    def _ensure_child(self, num_threads: int) -> _Child:
        child = self._start_child(num_threads)
        try:
            child.wait_ready()
        except BaseException:
            child.kill()
            self._child = None
            raise
        return child

    def _drop_child(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None
            self.restarts += 1

    def probe(self) -> bool:
        """Health probe (a quarantined worker asks before taking work again): can a measuring
        process start on this machine?"""
        try:
            self._ensure_child(self._child.num_threads if self._child else 1)
            return True
        except (_ChildDied, _Deadline, OSError):
            self._drop_child()
            return False

    def measure(self, inputs: Iterable[MeasureInput],
                on_result: Callable[[MeasureResult], None] | None = None) -> list[MeasureResult]:
        results = []
        for inp in inputs:
            res = self.measure_one(inp)
            if on_result is not None:
                on_result(res)
            results.append(res)
        return results

    def prepare(self, inputs: list[MeasureInput]) -> None:
        """Build a batch in parallel now; `measure_one` then only loads, verifies and times. The
        sandbox process starts meanwhile."""
        if inputs:
            with contextlib.suppress(OSError):  # measure_one reports it
                self._start_child(inputs[0].options.num_threads)
        if self._prebuilder is not None:
            self._built.update(self._prebuilder.build(list(inputs)))

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        built = self._built.pop(inp.trial_id, None)
        if built is None:
            return self._measure_in_sandbox(inp)
        if built.path is None:
            return self._tag(MeasureResult.failure(
                inp.trial_id, built.invalidity or Invalidity.BUILD_ERROR,
                built.error_msg or "build failed"))
        try:
            res = self._measure_in_sandbox(replace(inp, artifact=built.path,
                                                    artifact_params=built.params,
                                                    artifact_sha256=built.sha256))
        finally:
            assert self._prebuilder is not None
            self._prebuilder.discard(built.path)
        return replace(res, build_s=built.build_s)

    def _measure_in_sandbox(self, inp: MeasureInput) -> MeasureResult:
        try:
            child = self._ensure_child(inp.options.num_threads)
        except (_ChildDied, _Deadline, OSError) as exc:
            self._drop_child()
            return self._tag(MeasureResult.failure(
                inp.trial_id, Invalidity.WORKER_LOST,
                f"could not start the measuring process: {exc}"))
        phase = "sending"
        build_s = None
        try:
            child.send(inp)
            while True:
                timeout = {"sending": SEND_TIMEOUT_S, "preparing": PREPARE_TIMEOUT_S,
                           "building": inp.options.build_timeout_s,
                           "running": inp.options.run_timeout_s}[phase]
                msg = child.read(timeout)
                if msg.get("trial_id") != inp.trial_id:
                    continue
                if msg["phase"] == "done":
                    return self._tag(MeasureResult.from_json(json.dumps(msg["result"])))
                phase = msg["phase"]
                build_s = msg.get("build_s", build_s)
        except _Deadline:
            self._drop_child()
            limit = {"sending": (Invalidity.WORKER_LOST, SEND_TIMEOUT_S),
                     "building": (Invalidity.BUILD_TIMEOUT, inp.options.build_timeout_s),
                     "running": (Invalidity.RUN_TIMEOUT, inp.options.run_timeout_s),
                     "preparing": (Invalidity.RUN_TIMEOUT, PREPARE_TIMEOUT_S)}
            inv, secs = limit.get(phase, (Invalidity.WORKER_LOST, PREPARE_TIMEOUT_S))
            return self._tag(MeasureResult.failure(
                inp.trial_id, inv,
                f"{phase} did not finish within {secs:g} s; process group killed",
                build_s=build_s))
        except _ChildDied as exc:
            tail = child.log_tail()
            self._drop_child()
            inv = {"building": Invalidity.BUILD_ERROR, "running": Invalidity.RUN_ERROR,
                   "preparing": Invalidity.RUN_ERROR}.get(phase, Invalidity.WORKER_LOST)
            why = f"{exc} while {phase} the candidate" + (f"; last output: {tail}" if tail else "")
            why += f" (sandbox limits: {Limits.from_settings().describe()})"
            return self._tag(MeasureResult.failure(inp.trial_id, inv, why, build_s=build_s))

    def _tag(self, res: MeasureResult) -> MeasureResult:
        return replace(res, worker=self.worker_id)

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None
        if self._own_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)
        if self._prebuilder is not None:
            self._prebuilder.close()
