"""RPC measurement: candidates are built here and timed on a board behind a TVM RPC tracker.

`RpcMeasurer` implements the `tuner.measure.Measurer` interface. Per candidate:

    build (a build process with the build deadline: tuner.measure.builder; a `.tar` for another
    architecture) -> reference outputs (once per workload; a `tir` workload's in a sandboxed
    build process, never in the worker) -> five timed steps on a board:
    session  ask the tracker for a free server of the key, within `request_timeout_s`
    upload   send the library, load it on the board
    allocate the workload's inputs and zeroed outputs (random packed weights for a kernel whose
             weights are pre-packed)
    run      warm-up + verification against the reference + `repeats` timed repeats, in a
             thread with the run deadline
    cleanup  drop the remote objects and the session

Failures are results, never exceptions: a build that raises is BUILD_ERROR, one past its deadline
BUILD_TIMEOUT; a kernel that raises on the board RUN_ERROR, one past the run deadline RUN_TIMEOUT
(the session is abandoned; the server kills it after the session timeout); wrong outputs
WRONG_ANSWER. No free board, a dead tracker, a server that dies mid-run (kShutdown, Broken pipe,
refused connections) are WORKER_LOST: failures of the farm, retried elsewhere, never trained on.
A session that ends mid-run while its server still listens is the kernel's doing (it crashed the
session's process): RUN_ERROR.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from tuner.measure.builder import Built, Prebuilder
from tuner.measure.evaluate import (
    ArtifactError,
    Prepared,
    allocate,
    check,
    checked_bytes,
    first_line,
    random_args,
    time_kernel,
)

if TYPE_CHECKING:
    from tuner.core.tvm_api import RuntimeModule, Tensor, tvm

log = logging.getLogger(__name__)
T = TypeVar("T")

STEP_TIMEOUT_S = 120.0  # upload + load, allocate: past it the board is taken for lost
CLEANUP_TIMEOUT_S = 10.0
MAX_PREPARED = 16  # workloads whose inputs and reference outputs are kept
_LOST = ("kshutdown", "broken pipe", "connection refused", "connection reset", "socket",
         "rpcsessiontimeouterror", "session", "connect to", "eof")


class _StepTimeout(Exception):
    pass


class _Failed(Exception):
    """Ends a measurement with a result."""

    def __init__(self, invalidity: Invalidity, msg: str, max_abs_err: float | None = None) -> None:
        super().__init__(msg)
        self.invalidity, self.msg, self.max_abs_err = invalidity, msg, max_abs_err


def call_with_deadline(fn: Callable[[], T], timeout_s: float, name: str = "rpc-step") -> T:
    """`fn()` in a daemon thread; its value or exception, or _StepTimeout past `timeout_s` (the
    thread is abandoned: a remote call cannot be interrupted, FFI calls release the GIL)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    th = threading.Thread(target=target, name=name, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise _StepTimeout()
    if "error" in box:
        raise box["error"]
    return cast(T, box.get("value"))  # set: the thread ended without an error


def is_connection_error(exc: BaseException) -> bool:
    """Does `exc` say the RPC connection (not the kernel) failed?"""
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, OSError) or any(m in text for m in _LOST)


def server_alive(host: str, port: int, *, tries: int = 3, every_s: float = 0.5) -> bool:
    """Does the board's server still listen? Asked `tries` times, `every_s` apart: a killed
    process group takes a moment to close its sockets after the session's process died.

    A kernel that crashes the session's process leaves the server process listening (though
    TVM's rpc_server stops serving and leaves the tracker: restart it), a killed one does not."""
    for _ in range(tries):
        time.sleep(every_s)
        try:
            with socket.create_connection((host, port), timeout=2.0):
                pass
        except OSError:
            return False
    return True


@dataclass
class _Board:
    host: str
    port: int
    sess: tvm.rpc.RPCSession
    dev: tvm.runtime.Device

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


class RpcMeasurer(Measurer):
    """Measures candidates on boards registered with a TVM RPC tracker under `key`."""

    def __init__(self, tracker_host: str, tracker_port: int, key: str, *,
                 session_timeout_s: float | None = None, request_timeout_s: float = 60.0,
                 worker_id: str | None = None, build_workers: int = 1, priority: int = 1,
                 deadline_factor: float = 1.0) -> None:
        """`session_timeout_s`: the longest a board serves one candidate; its server kills the
        session past it, which frees a board wedged by a hanging kernel (default: the build and
        run deadlines + 60 s). `request_timeout_s`: how long to wait for a free board.
        `build_workers`: build processes (a prepared batch is built in parallel).
        `deadline_factor`: the board steps' deadlines (upload, allocate, run, session) times
        this: an emulated board (`Settings.deadline_factor`) runs 10-100x slower."""
        self.tracker = (tracker_host, int(tracker_port))
        self.key = key
        self.session_timeout_s = session_timeout_s
        self.request_timeout_s = request_timeout_s
        self.priority = priority
        self.factor = max(1.0, float(deadline_factor))
        self.step_timeout_s = STEP_TIMEOUT_S * self.factor  # upload + load, allocate
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:rpc:{key}"
        self._prebuilder = Prebuilder(max(1, build_workers))
        self._built: dict[str, Built] = {}
        self._prepared: dict[str, Prepared] = {}
        self.board: tuple[str, int] | None = None  # the board of the session in progress
        self.step: str | None = None  # the step in progress
        self.last_steps: dict[str, float] = {}  # seconds per step of the last measurement

    # -- Measurer interface ----------------------------------------------------------------

    def prepare(self, inputs: list[MeasureInput]) -> None:
        """Build a batch in parallel now; `measure_one` then only runs it on a board."""
        self._built.update(self._prebuilder.build(list(inputs)))

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        try:
            res = self._measure(inp)
        except Exception as exc:  # never an exception out of measure_one
            log.exception("trial %s: unexpected failure", inp.trial_id)
            res = MeasureResult.failure(inp.trial_id, Invalidity.WORKER_LOST,
                                        f"the RPC measurer failed: {first_line(exc)}")
        finally:
            self.board, self.step = None, None
        return res if res.worker else replace(res, worker=self.worker_id)

    def probe(self) -> bool:
        """Health probe (a quarantined worker asks before taking work again): does the tracker
        answer and list a server for the key?"""
        from tuner.core import tvm_api as tv

        try:
            summary = call_with_deadline(lambda: tv.rpc_tracker_summary(*self.tracker), 10.0)
        except Exception:  # incl. a timeout
            return False
        return any(s.get("key") == f"server:{self.key}" for s in summary.get("server_info", []))

    def close(self) -> None:
        for built in self._built.values():
            self._prebuilder.discard(built.path)
        self._built.clear()
        self._prebuilder.close()

    # -- one candidate ---------------------------------------------------------------------

    def _measure(self, inp: MeasureInput) -> MeasureResult:
        tid, opts = inp.trial_id, inp.options
        built = self._built.pop(tid, None) or self._prebuilder.build([inp])[tid]
        if built.path is None:
            return MeasureResult.failure(tid, built.invalidity or Invalidity.BUILD_ERROR,
                                         built.error_msg or "build failed")
        try:
            prep = self._prepare_workload(inp)
            if opts.verify:  # before a board is held
                self._ensure_reference(inp, prep)
            packed = built.params is not None and built.params != [
                (tuple(s), d) for _, s, d in prep.arg_specs]
            latencies, max_err = self._on_board(inp, built, prep, packed)
        except _Failed as f:
            return MeasureResult.failure(tid, f.invalidity, f.msg, build_s=built.build_s,
                                         worker=self._worker_tag(), max_abs_err=f.max_abs_err)
        finally:
            self._prebuilder.discard(built.path)
        return MeasureResult(trial_id=tid, invalidity=Invalidity.OK, latencies_s=latencies,
                             build_s=built.build_s, worker=self._worker_tag(), max_abs_err=max_err)

    def _ensure_reference(self, inp: MeasureInput, prep: Prepared) -> None:
        """A `tir` workload's reference runs its submitted program: in a sandboxed build
        process, never here (this process holds the worker's token). The built-in ops'
        references are numpy, computed here."""
        if prep.reference is not None:
            return
        if prep.workload.op != "tir":
            prep.ensure_reference(lambda _msg: None, inp.trial_id)
            prep.ensure_fill()
            return
        timeout = inp.options.build_timeout_s + inp.options.run_timeout_s
        try:
            prep.reference, prep.fill = self._prebuilder.reference(inp.workload_spec, prep.seed,
                                                                   timeout)
        except RuntimeError as exc:
            raise _Failed(Invalidity.RUN_ERROR, str(exc)) from exc

    def _worker_tag(self) -> str:
        return f"{self.worker_id}@{self.board[0]}:{self.board[1]}" if self.board else self.worker_id

    def _prepare_workload(self, inp: MeasureInput) -> Prepared:
        prep = self._prepared.get(inp.workload_key)
        if prep is None:
            if len(self._prepared) >= MAX_PREPARED:
                self._prepared.pop(next(iter(self._prepared)))
            prep = self._prepared[inp.workload_key] = Prepared(inp.workload_spec)
        return prep

    @contextmanager
    def _step(self, name: str) -> Iterator[None]:
        self.step = name
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.last_steps[name] = self.last_steps.get(name, 0.0) + time.perf_counter() - t0

    def _on_board(self, inp: MeasureInput, built: Built, prep: Prepared, packed: bool
                  ) -> tuple[tuple[float, ...], float | None]:
        opts = inp.options
        assert built.path is not None  # a failed build never reaches a board
        self.last_steps = {}
        h: dict[str, Any] = {}  # holds every remote object (no local does): cleanup drops them
        try:
            with self._step("session"):
                h["board"] = self._session(inp)
            h["rt"] = self._upload(h["board"], built.path, built.sha256)
            with self._step("allocate"):
                h["args"] = self._bounded(
                    lambda: random_args(built.params or [], h["board"].dev) if packed
                    else allocate(prep, h["board"].dev, fill=prep.fill or "zeros"),
                    self.step_timeout_s, "allocating the arguments")
            with self._step("run"):
                latencies, max_err = self._run(h["board"], lambda: self._run_kernel(
                    h["rt"], h["args"], prep, inp, h["board"].dev,
                    check_outputs=not packed and opts.verify), opts.run_timeout_s * self.factor)
            if packed and opts.verify and (opts.verify_below_s is None
                                           or statistics.median(latencies) < opts.verify_below_s):
                max_err = self._verify_whole(inp, prep, h)
            return latencies, max_err
        finally:
            # a failure, incl. a timeout, is fine: the session is gone anyway
            with self._step("cleanup"), contextlib.suppress(Exception):
                call_with_deadline(h.clear, CLEANUP_TIMEOUT_S, "rpc-cleanup")
            log.debug("trial %s on %s: %s", inp.trial_id, self._worker_tag(),
                      " ".join(f"{k} {v:.3f}s" for k, v in self.last_steps.items()))

    def _session(self, inp: MeasureInput) -> _Board:
        """Ask the tracker for a free board, within `request_timeout_s`; retry a stale entry."""
        from tuner.core import tvm_api as tv

        opts = inp.options
        session_s = self.session_timeout_s or (
            opts.build_timeout_s + (opts.run_timeout_s + 60) * self.factor)
        deadline = time.monotonic() + self.request_timeout_s
        last = ""
        while (left := deadline - time.monotonic()) > 0:
            try:
                host, port, matchkey = tv.rpc_request_server(
                    *self.tracker, self.key, timeout_s=left, priority=self.priority)
            except TimeoutError:
                break
            except (OSError, ValueError) as exc:
                raise _Failed(Invalidity.WORKER_LOST, f"the RPC tracker {self.tracker[0]}:"
                              f"{self.tracker[1]} did not answer: {first_line(exc)}") from exc
            try:
                connect = functools.partial(tv.rpc_connect, host, port, matchkey,
                                            session_timeout_s=session_s)
                sess = call_with_deadline(connect, max(left, 5.0), "rpc-connect")
                self.board = (host, port)
                return _Board(host, port, sess, sess.cpu(0))
            except Exception as exc:  # a board that went away: ask again
                last = f"; last error: {first_line(exc)}"
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        raise _Failed(Invalidity.WORKER_LOST, f"no free board with key {self.key} within "
                      f"{self.request_timeout_s:g} s{last}")

    def _bounded(self, fn: Callable[[], T], timeout_s: float, what: str) -> T:
        """An infrastructure step: any failure or a timeout loses the board."""
        try:
            return call_with_deadline(fn, timeout_s, f"rpc-{self.step}")
        except _StepTimeout as exc:
            raise _Failed(Invalidity.WORKER_LOST,
                          f"{what} on the board did not finish within {timeout_s:g} s") from exc
        except Exception as exc:
            raise _Failed(Invalidity.WORKER_LOST, f"{what} on the board failed: "
                          f"{first_line(exc)}") from exc

    def _upload(self, board: _Board, path: str, sha256: str | None) -> RuntimeModule:
        """Send the built library's bytes, once checked against the sha256 the builder took, and
        load them on the board; a mismatch is a build_error, never a load."""
        try:
            data = checked_bytes(path, sha256)
        except ArtifactError as exc:
            raise _Failed(Invalidity.BUILD_ERROR, str(exc)) from exc
        with self._step("upload"):
            def send_and_load() -> RuntimeModule:
                board.sess.upload(bytearray(data), os.path.basename(path))
                return board.sess.load_module(os.path.basename(path))

            return self._bounded(send_and_load, self.step_timeout_s,
                                 "uploading and loading the library")

    def _run(self, board: _Board, fn: Callable[[], T], timeout_s: float) -> T:
        """A step that runs the kernel, with the run deadline."""
        try:
            return call_with_deadline(fn, timeout_s, "rpc-run")
        except _StepTimeout as exc:
            raise _Failed(Invalidity.RUN_TIMEOUT, f"the kernel did not finish within "
                          f"{timeout_s:g} s on {board.name}; session abandoned") from exc
        except _Failed:
            raise
        except Exception as exc:
            if is_connection_error(exc) and not server_alive(board.host, board.port):
                raise _Failed(Invalidity.WORKER_LOST, f"the board {board.name} was lost while "
                              f"running the kernel: {first_line(exc)}") from exc
            if is_connection_error(exc):
                raise _Failed(Invalidity.RUN_ERROR, f"the board's session ended while running the "
                              f"kernel (did it crash?): {first_line(exc)}") from exc
            raise _Failed(Invalidity.RUN_ERROR, first_line(exc)) from exc

    def _run_kernel(self, rt: RuntimeModule, args: list[Tensor], prep: Prepared,
                    inp: MeasureInput, dev: tvm.runtime.Device,
                    *, check_outputs: bool) -> tuple[tuple[float, ...], float | None]:
        """(In the run thread.) Warm-up (the verification run), check, time."""
        rt["main"](*args)
        max_err = None
        if check_outputs:
            max_err = self._check(args, prep)
        return time_kernel(rt, args, inp.options, dev), max_err

    @staticmethod
    def _check(args: list[Tensor], prep: Prepared) -> float:
        outputs = [a.numpy() for a in args[len(prep.inputs):]]
        assert prep.reference is not None
        ok, max_err, why = check(outputs, prep.reference, prep.rtol, prep.atol)
        if not ok:
            raise _Failed(Invalidity.WRONG_ANSWER, why or "wrong answer", max_abs_err=max_err)
        return max_err

    def _verify_whole(self, inp: MeasureInput, prep: Prepared, h: dict[str, Any]) -> float:
        """A kernel with pre-packed weights is verified through the whole program (packing
        included): built now, run on the same board."""
        whole = self._prebuilder.build([inp], whole=True)[inp.trial_id]
        if whole.path is None:
            raise _Failed(whole.invalidity or Invalidity.BUILD_ERROR, whole.error_msg or "")
        try:
            h["rt_whole"] = self._upload(h["board"], whole.path, whole.sha256)
        finally:
            self._prebuilder.discard(whole.path)
        with self._step("allocate"):
            h["args_whole"] = self._bounded(
                lambda: allocate(prep, h["board"].dev, fill=prep.fill or "zeros"),
                self.step_timeout_s, "allocating the arguments")
        with self._step("run"):
            return float(self._run(h["board"], lambda: self._run_whole(h, prep),
                                   inp.options.run_timeout_s * self.factor))

    def _run_whole(self, h: dict[str, Any], prep: Prepared) -> float:
        h["rt_whole"]["main"](*h["args_whole"])
        return self._check(h["args_whole"], prep)
