"""The measuring child process: `python -m tuner.measure.sandbox RESPONSE_FD [--drop=USER]`.

Reads one `MeasureInput` JSON per line on stdin; for each it replays the trace onto the workload,
builds, runs, verifies against the reference and times the kernel, writing progress messages and
finally one `MeasureResult` as JSON lines to RESPONSE_FD:

    {"trial_id": ..., "phase": "building"}
    {"trial_id": ..., "phase": "running", "build_s": ...}
    {"trial_id": ..., "phase": "preparing"}   (first verification of a workload: reference outputs)
    {"trial_id": ..., "phase": "running"}
    {"trial_id": ..., "phase": "done", "result": {...MeasureResult...}}

The parent (tuner.measure.local) enforces the build and run deadlines per phase and kills this whole
process group when a kernel hangs; a kernel that segfaults kills only this process. Either way the
parent records the failure and starts a fresh child. Nothing here may take the parent down.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.measure import Invalidity, MeasureInput, MeasureResult
from tuner.measure.evaluate import Prepared as _Prepared
from tuner.measure.evaluate import check as _check  # noqa: F401 - tests import it from here
from tuner.measure.evaluate import checked_bytes
from tuner.measure.evaluate import first_line as _first_line
from tuner.measure.evaluate import random_args as _random_args
from tuner.measure.evaluate import run_and_check as _run_and_check
from tuner.measure.evaluate import time_kernel as _time

if TYPE_CHECKING:
    from tuner.core.tvm_api import IRModule, RuntimeModule, Schedule, Target, Tensor, tvm


def measure_one(inp: MeasureInput, prep: _Prepared,
                send: Callable[[dict[str, Any]], None]) -> MeasureResult:
    """Build, verify and time one candidate.

    A program whose weights MetaSchedule/templates pack (layout-rewrite blocks) is timed as the
    kernel alone, on pre-packed weights. It is verified when it beats `verify_below_s` (the job's
    best so far: every candidate that could become best is verified, the rest need not be): the
    timed kernel runs on the workload's inputs with its weights packed by the program's own
    packing functions, compiled apart once per workload (`tuner.measure.packing`). Where that split
    fails, the whole program (packing included) is built and run instead.
    """
    from tuner.core import tvm_api as tv
    from tuner.core.prepack import kernel as kernel_of

    opts = inp.options
    tid = inp.trial_id
    send({"trial_id": tid, "phase": "building"})
    t0 = time.perf_counter()
    sch = None  # the replayed program, when this process needed it
    try:
        target = tv.make_target(inp.target)
        if inp.artifact and inp.artifact_params is not None:  # built ahead by tuner.measure.builder
            rt = _load_verified(tv, inp)
            params = list(inp.artifact_params)
        else:
            sch = _replay(prep, inp.trace_json)
            kernel_mod = kernel_of(sch.mod)
            rt = (_load_verified(tv, inp) if inp.artifact
                  else tv.compile_module(kernel_mod, target))
            params = tv.param_specs(kernel_mod)
        packed = params != [(s, d) for _, s, d in prep.arg_specs]
    except Exception as exc:  # a failed build is data
        return MeasureResult.failure(tid, Invalidity.BUILD_ERROR, _why(exc))
    build_s = time.perf_counter() - t0
    send({"trial_id": tid, "phase": "running", "build_s": build_s})
    dev = tv.tvm.cpu(0)
    max_err = None
    try:
        if not packed:
            args, ok, max_err, why = _run_and_check(rt, prep, send, tid, dev)
            if opts.verify and not ok:
                return MeasureResult.failure(tid, Invalidity.WRONG_ANSWER, why or "wrong answer",
                                             build_s=build_s, max_abs_err=max_err)
            if not opts.verify:
                max_err = None
        else:
            args = _random_args(params, dev)
            rt["main"](*args)  # warm-up of the timed kernel
        latencies = _time(rt, args, opts, dev)
    except Exception as exc:
        return MeasureResult.failure(tid, Invalidity.RUN_ERROR, _why(exc), build_s=build_s)
    median = float(np.median(latencies))
    if packed and opts.verify and (opts.verify_below_s is None or median < opts.verify_below_s):
        send({"trial_id": tid, "phase": "building"})
        try:
            if sch is None:
                sch = _replay(prep, inp.trace_json)
            rt_check, inputs = _packed_or_whole(tv, sch.mod, prep, params, target, dev)
        except Exception as exc:
            return MeasureResult.failure(tid, Invalidity.BUILD_ERROR, _why(exc),
                                         build_s=build_s)
        send({"trial_id": tid, "phase": "running"})
        try:
            _, ok, max_err, why = _run_and_check(rt if rt_check is None else rt_check, prep,
                                                 send, tid, dev, inputs)
        except Exception as exc:
            return MeasureResult.failure(tid, Invalidity.RUN_ERROR, _why(exc),
                                         build_s=build_s)
        if not ok:
            return MeasureResult.failure(tid, Invalidity.WRONG_ANSWER, why or "wrong answer",
                                         build_s=build_s, max_abs_err=max_err)
    return MeasureResult(trial_id=tid, invalidity=Invalidity.OK, latencies_s=latencies,
                         build_s=build_s, max_abs_err=max_err)


def _packed_or_whole(tv: ModuleType, sched_mod: IRModule, prep: _Prepared,
                     params: list[tuple[tuple[int, ...], str]], target: Target,
                     dev: tvm.runtime.Device) -> tuple[RuntimeModule | None, list[Tensor] | None]:
    """What verifies a kernel timed on packed weights: (None, its inputs with the weights
    packed), to run the timed kernel itself on; or, where the program does not split into
    packing and kernel as expected, (the whole program built, None)."""
    try:
        inputs = prep.packer.kernel_inputs(sched_mod, target, dev)
        outs = [(tuple(shape), dt) for _, shape, dt in prep.arg_specs[len(prep.inputs):]]
        specs = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in inputs] + outs
        if specs == [(tuple(shape), str(dt)) for shape, dt in params]:  # what the kernel takes
            return None, inputs
    except Exception:  # any failure to split: verify the whole program
        traceback.print_exc()
    return tv.compile_module(sched_mod, target), None


def verified_artifact(inp: MeasureInput) -> str:
    """A private copy of `inp.artifact` whose bytes hash to `inp.artifact_sha256`; the bytes are
    read once, checked, and written to this process's own directory, so the file that is loaded is
    exactly the one that was checked (a swap after the check cannot reach `load_module`)."""
    assert inp.artifact is not None
    data = checked_bytes(inp.artifact, inp.artifact_sha256)
    fd, path = tempfile.mkstemp(suffix=os.path.splitext(inp.artifact)[1], prefix="artifact-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _load_verified(tv: ModuleType, inp: MeasureInput) -> RuntimeModule:
    """Load the checked private copy, then remove it (the loaded library stays mapped)."""
    path = verified_artifact(inp)
    try:
        return tv.tvm.runtime.load_module(path)
    finally:
        os.remove(path)


def _out_of_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, MemoryError) or any(
        w in text for w in ("memory", "bad_alloc", "cannot allocate", "alloc"))


def _why(exc: BaseException) -> str:
    """The error's first line; an allocation failure also names this process's address-space
    limit (the likely cause in the sandbox)."""
    msg = _first_line(exc)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and _out_of_memory(exc):
        msg += f" (sandbox address-space limit {soft >> 20} MiB)"
    return msg


def _replay(prep: _Prepared, trace_json: str) -> Schedule:
    """The candidate's program: its trace replayed onto the workload. Only a candidate that was
    not built ahead, or a packed one to verify whole, needs it."""
    from schedules.registry import replay

    return replay(prep.mod, trace_json)


def warm_imports() -> None:
    """Import everything a measurement needs, for a child that then drops to a user who cannot
    read the interpreter's own files."""
    import ctypes  # noqa: F401
    import subprocess  # noqa: F401

    import schedules.registry  # noqa: F401
    import tuner.workloads
    from tuner.core import tvm_api as tv

    target = tv.make_target({"kind": "llvm"})
    wl = tuner.workloads.parse_spec({"op": "matmul", "shape": [4, 4, 4]})
    rt = tv.compile_module(wl.mod(), target)
    with tempfile.TemporaryDirectory() as d:
        tv.tvm.runtime.load_module(tv.export_library(rt, os.path.join(d, "warm.so")))


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so a SIGKILLed tuner leaves no hanging kernel."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1
    out = os.fdopen(int(argv[1]), "w", buffering=1)

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    drop = [a.split("=", 1)[1] for a in argv if a.startswith("--drop=")]
    if drop:  # (started as root with the limits already set) imports first, then no root
        warm_imports()
        from tuner.core.isolation import Limits

        Limits(memory_mb=None, cpu_s=None, fsize_mb=None, user=drop[0]).drop_now()
    prepared: dict[str, _Prepared] = {}
    send({"phase": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        inp = MeasureInput.from_json(line)
        try:
            prep = prepared.get(inp.workload_key)
            if prep is None:
                prep = prepared[inp.workload_key] = _Prepared(inp.workload_spec)
            result = measure_one(inp, prep, send)
        except Exception as exc:  # never die on bad input
            traceback.print_exc()
            inv = Invalidity.RUN_ERROR if _out_of_memory(exc) else Invalidity.BUILD_ERROR
            result = MeasureResult.failure(inp.trial_id, inv,
                                           "could not prepare the workload: " + _why(exc))
        send({"trial_id": inp.trial_id, "phase": "done", "result": json.loads(result.to_json())})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
