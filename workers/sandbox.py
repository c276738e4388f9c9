"""The measuring child process: `python -m workers.sandbox RESPONSE_FD`.

Reads one `MeasureInput` JSON per line on stdin; for each it replays the trace onto the workload,
builds, runs, verifies against the reference and times the kernel, writing progress messages and
finally one `MeasureResult` as JSON lines to RESPONSE_FD:

    {"trial_id": ..., "phase": "building"}
    {"trial_id": ..., "phase": "running", "build_s": ...}
    {"trial_id": ..., "phase": "preparing"}   (first verification of a workload: reference outputs)
    {"trial_id": ..., "phase": "running"}
    {"trial_id": ..., "phase": "done", "result": {...MeasureResult...}}

The parent (workers.local) enforces the build and run deadlines per phase and kills this whole
process group when a kernel hangs; a kernel that segfaults kills only this process. Either way the
parent records the failure and starts a fresh child. Nothing here may take the parent down.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

from tuner.measure import Invalidity, MeasureInput, MeasureResult


class _Prepared:
    """A workload's inputs and reference outputs, computed once per child per workload."""

    def __init__(self, spec: dict[str, Any], seed: int = 0) -> None:
        from tuner.workloads import parse_spec

        self.workload = parse_spec(spec)
        self.mod = self.workload.mod()
        self.inputs = self.workload.make_inputs(seed)
        self.arg_specs = self.workload.arg_specs()
        self.rtol, self.atol = self.workload.tolerance()
        self.reference: list[np.ndarray] | None = None

    def ensure_reference(self, send: Any, trial_id: str) -> list[np.ndarray]:
        if self.reference is None:
            send({"trial_id": trial_id, "phase": "preparing"})
            self.reference = self.workload.reference(self.inputs)
        return self.reference


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # TVM errors end with the meaningful line; keep the head and the tail
    if len(lines) > 6:
        lines = lines[:2] + ["..."] + lines[-3:]
    return f"{type(exc).__name__}: " + " | ".join(lines)[:2000]


def _check(outputs: list[np.ndarray], reference: list[np.ndarray], rtol: float,
           atol: float) -> tuple[bool, float, str | None]:
    """Compare kernel outputs with the reference: |got - ref| <= atol + rtol * |ref| everywhere."""
    worst = 0.0
    for idx, (got, ref) in enumerate(zip(outputs, reference, strict=True)):
        if got.shape != ref.shape:
            return False, math.inf, f"output {idx}: shape {got.shape} != reference {ref.shape}"
        fin_got, fin_ref = np.isfinite(got), np.isfinite(ref)
        if not np.array_equal(fin_got, fin_ref) or not np.array_equal(
                got[~fin_ref], ref[~fin_ref], equal_nan=True):
            return False, math.inf, f"output {idx}: non-finite values where the reference has none"
        got, ref = got[fin_ref], ref[fin_ref]
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        err = float(diff.max()) if diff.size else 0.0
        worst = max(worst, err)
        bound = atol + rtol * np.abs(ref.astype(np.float64))
        if np.any(diff > bound):
            bad = int(np.count_nonzero(diff > bound))
            return False, worst, (f"output {idx}: {bad} of {diff.size} elements differ from the "
                                  f"reference (max abs err {err:.3g}, rtol {rtol}, atol {atol})")
    return True, worst, None


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127), size=shape).astype(dtype)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def _time(rt: Any, args: list[Any], opts: Any, dev: Any) -> tuple[float, ...]:
    if opts.cache_flush:
        # number=1 so every timed run starts with cold caches (TVM flushes all args but the first)
        ev = rt.time_evaluator("main", dev, number=1, repeat=max(opts.repeats, 1),
                               f_preproc="cache_flush_cpu_non_first_arg")
    else:
        ev = rt.time_evaluator("main", dev, number=1, repeat=max(opts.repeats, 1),
                               min_repeat_ms=int(math.ceil(opts.min_repeat_ms)))
    return tuple(float(x) for x in ev(*args).results)


def _run_and_check(rt: Any, prep: _Prepared, send: Any, trial_id: str, dev: Any
                   ) -> tuple[list[Any], bool, float | None, str | None]:
    """Run the program on the workload's inputs (outputs zeroed) and compare with the reference."""
    from tuner import tvm_api as tv

    n_in = len(prep.inputs)
    args = [tv.tvm.runtime.tensor(a, dev) for a in prep.inputs]
    for _, shape, dtype in prep.arg_specs[n_in:]:  # zeroed, as the references assume
        args.append(tv.tvm.runtime.tensor(np.zeros(shape, dtype), dev))
    rt["main"](*args)
    outputs = [a.numpy() for a in args[n_in:]]
    reference = prep.ensure_reference(send, trial_id)
    send({"trial_id": trial_id, "phase": "running"})
    ok, max_err, why = _check(outputs, reference, prep.rtol, prep.atol)
    return args, ok, max_err, why


def measure_one(inp: MeasureInput, prep: _Prepared, send: Any) -> MeasureResult:
    """Build, verify and time one candidate.

    A program whose weights MetaSchedule/templates pack (layout-rewrite blocks) is timed as the
    kernel alone, on pre-packed weights; verifying it needs a second build of the whole program,
    which is done only when the kernel beats `verify_below_s` (the job's best so far): every
    candidate that could become best is verified, the rest are not built twice.
    """
    from tuner import tvm_api as tv

    opts = inp.options
    tid = inp.trial_id
    send({"trial_id": tid, "phase": "building"})
    t0 = time.perf_counter()
    try:
        target = tv.make_target(inp.target)
        sch = tv.apply_trace(prep.mod, inp.trace_json)
        kernel_mod = tv.strip_layout_rewrite(sch.mod)
        if inp.artifact:  # built ahead by workers.builder
            rt = tv.tvm.runtime.load_module(inp.artifact)
        else:
            rt = tv.compile_module(kernel_mod, target)
        packed = tv.param_specs(kernel_mod) != [(s, d) for _, s, d in prep.arg_specs]
    except Exception as exc:  # noqa: BLE001 - a failed build is data
        return MeasureResult.failure(tid, Invalidity.BUILD_ERROR, _first_line(exc))
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
            rng = np.random.default_rng(0)
            args = [tv.tvm.runtime.tensor(_random(rng, shape, dtype), dev)
                    for shape, dtype in tv.param_specs(kernel_mod)]
            rt["main"](*args)  # warm-up of the timed kernel
        latencies = _time(rt, args, opts, dev)
    except Exception as exc:  # noqa: BLE001
        return MeasureResult.failure(tid, Invalidity.RUN_ERROR, _first_line(exc), build_s=build_s)
    median = float(np.median(latencies))
    if packed and opts.verify and (opts.verify_below_s is None or median < opts.verify_below_s):
        send({"trial_id": tid, "phase": "building"})
        try:
            rt_whole = tv.compile_module(sch.mod, target)
        except Exception as exc:  # noqa: BLE001
            return MeasureResult.failure(tid, Invalidity.BUILD_ERROR, _first_line(exc), build_s=build_s)
        send({"trial_id": tid, "phase": "running"})
        try:
            _, ok, max_err, why = _run_and_check(rt_whole, prep, send, tid, dev)
        except Exception as exc:  # noqa: BLE001
            return MeasureResult.failure(tid, Invalidity.RUN_ERROR, _first_line(exc), build_s=build_s)
        if not ok:
            return MeasureResult.failure(tid, Invalidity.WRONG_ANSWER, why or "wrong answer",
                                         build_s=build_s, max_abs_err=max_err)
    return MeasureResult(trial_id=tid, invalidity=Invalidity.OK, latencies_s=latencies,
                         build_s=build_s, max_abs_err=max_err)


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
    import schedules.families  # noqa: F401 - every template's tensor intrinsics, for replay

    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1
    out = os.fdopen(int(argv[1]), "w", buffering=1)

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

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
        except Exception as exc:  # noqa: BLE001 - never die on bad input
            traceback.print_exc()
            result = MeasureResult.failure(inp.trial_id, Invalidity.BUILD_ERROR,
                                           "could not prepare the workload: " + _first_line(exc))
        send({"trial_id": inp.trial_id, "phase": "done", "result": json.loads(result.to_json())})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
