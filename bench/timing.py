"""Timing variants of one workload in one process, interleaved, with every output checked.

A round times every variant once, round-robin (the starting variant rotates each round); one
timing is a run of repeated calls lasting at least `min_ms`, and gives seconds per call. The
result of a variant is the median over rounds. TVM kernels are timed with TVM's
`time_evaluator` (a C++ loop; TVM grows the call count until the run lasts min_ms); PyTorch and
numpy with a Python loop of their natural call (their per-call overhead is part of their cost).
A TVM kernel with `python_loop` is timed in the same Python loop as PyTorch (its packed function
called from Python): against its C++ loop, that is the dispatch cost, reported apart.

Outputs are checked against the workload's reference twice: after the first call (outputs
zeroed first, as the references assume) and after the last timed call, which also catches
kernels that accumulate into their output across calls.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# between timings: lets the previous library's spinning worker threads go idle. OpenBLAS threads
# busy-wait ~2^28 cycles (~65 ms here) after a call and TVM's spin too: measured, a torch matmul
# right after a TVM kernel took 13.6 ms, after a 100 ms pause 10.6 ms.
PAUSE_S = 0.3


def check(outputs: list[np.ndarray], reference: list[np.ndarray], rtol: float,
          atol: float) -> dict[str, Any]:
    """|got - ref| <= atol + rtol*|ref| everywhere, same shapes, non-finite values only where the
    reference has them (the rule tunefarm's sandbox applies)."""
    worst = 0.0
    if len(outputs) != len(reference):
        return {"ok": False, "max_abs_err": None,
                "error": f"{len(outputs)} outputs, the reference has {len(reference)}"}
    for i, (got, ref) in enumerate(zip(outputs, reference, strict=True)):
        got = np.asarray(got)
        if got.shape != ref.shape:
            return {"ok": False, "max_abs_err": None,
                    "error": f"output {i}: shape {got.shape} != reference {ref.shape}"}
        fin = np.isfinite(ref)
        if not np.array_equal(np.isfinite(got), fin):
            return {"ok": False, "max_abs_err": math.inf,
                    "error": f"output {i}: non-finite values where the reference has none"}
        diff = np.abs(got[fin].astype(np.float64) - ref[fin].astype(np.float64))
        err = float(diff.max()) if diff.size else 0.0
        worst = max(worst, err)
        bad = int(np.count_nonzero(diff > atol + rtol * np.abs(ref[fin].astype(np.float64))))
        if bad:
            return {"ok": False, "max_abs_err": worst,
                    "error": f"output {i}: {bad} of {diff.size} elements differ from the reference "
                             f"(max abs err {err:.3g}, rtol {rtol}, atol {atol})"}
    return {"ok": True, "max_abs_err": worst, "error": None}


def _as_list(out: Any) -> list[np.ndarray]:
    outs = out if isinstance(out, list | tuple) else [out]
    return [_numpy(o) for o in outs]


def _numpy(o: Any) -> np.ndarray:
    if isinstance(o, np.ndarray) or not hasattr(o, "numpy"):
        return np.asarray(o)
    if str(getattr(o, "dtype", "")) == "torch.bfloat16":  # numpy has no bf16: widen, exactly
        o = o.float()
    return o.numpy()


@dataclass
class Variant:
    """One implementation to time. Give either `kernel` (a bench.kernels.TvmKernel) or `fn`;
    a kernel with `python_loop` is timed in a Python loop of calls, as `fn` is."""

    name: str
    kernel: Any = None
    fn: Callable[[], Any] | None = None
    note: str = ""
    python_loop: bool = False
    # (rtol, atol) of this variant's check, where it differs from the workload's: PyTorch's bf16
    # GEMM rounds its output to bf16, tunefarm's op spec keeps the float32 sums
    tolerance: tuple[float, float] | None = None
    samples: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    _last: Any = None
    _ev: Any = None
    _batch: int = 1

    def _call(self) -> Any:
        if self.kernel is not None:
            self.kernel()
            return None
        self._last = self.fn()  # type: ignore[misc]
        return self._last

    def _outputs(self) -> list[np.ndarray]:
        return self.kernel.outputs() if self.kernel is not None else _as_list(self._last)

    def prepare(self, reference: list[np.ndarray], rtol: float, atol: float,
                min_ms: float) -> None:
        """Warm up, check the first output, and calibrate the calls per timing."""
        if self.kernel is not None:
            self.kernel.zero_outputs()
        self._call()
        rtol, atol = self.tolerance or (rtol, atol)
        self.checks.append(check(self._outputs(), reference, rtol, atol) | {"when": "first call"})
        t0 = time.perf_counter()
        self._call()
        one = max(time.perf_counter() - t0, 1e-7)
        min_s = min_ms / 1e3
        if self.kernel is not None and not self.python_loop:
            self._ev = self.kernel.evaluator(max(1, math.ceil(min_s / one)), min_ms)
        else:
            self._batch = max(1, min(math.ceil(0.01 / one), 1_000_000))  # ~10 ms per batch

    def measure(self, min_ms: float) -> None:
        """One timing of at least min_ms: appends seconds per call."""
        if self._ev is not None:
            t0 = time.perf_counter()
            per_call = self._ev()
            elapsed = time.perf_counter() - t0
            self.samples.append(per_call)
            self.calls.append(max(1, round(elapsed / per_call)) if per_call > 0 else 0)
            return
        min_s, n, batch = min_ms / 1e3, 0, self._batch
        call = self._call
        if self.kernel is not None:  # the packed function itself, as a library call is
            func, args = self.kernel.rt["main"], self.kernel.args

            def call() -> None:
                func(*args)
        t0 = time.perf_counter()
        while True:
            for _ in range(batch):
                call()
            n += batch
            elapsed = time.perf_counter() - t0
            if elapsed >= min_s:
                break
        self.samples.append(elapsed / n)
        self.calls.append(n)

    def final_check(self, reference: list[np.ndarray], rtol: float, atol: float) -> None:
        rtol, atol = self.tolerance or (rtol, atol)
        self.checks.append(check(self._outputs(), reference, rtol, atol) | {"when": "after timing"})

    @property
    def correct(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def result(self) -> dict[str, Any]:
        med = statistics.median(self.samples) if self.samples else None
        bad = [c for c in self.checks if not c["ok"]]
        return {"status": "ok" if self.correct else "WRONG", "median_s": med,
                "rounds_s": self.samples, "calls_per_round": self.calls,
                "checked": len(self.checks), "correct": self.correct,
                "max_abs_err": max((c["max_abs_err"] or 0.0 for c in self.checks), default=None),
                "check_error": bad[0]["error"] if bad else None, "checks": self.checks,
                "note": self.note}


def time_interleaved(variants: list[Variant], reference: list[np.ndarray], rtol: float,
                     atol: float, *, rounds: int, min_ms: float,
                     log: Callable[[str], None] = print,
                     pause_s: float = PAUSE_S) -> dict[str, dict[str, Any]]:
    """Times `variants`; returns {name: result dict}. A variant whose first call raises is
    reported with status "error" and left out of the rounds. `pause_s`: the pause after each
    timing (variants that are all TVM kernels need less than PAUSE_S)."""
    failed: dict[str, dict[str, Any]] = {}
    variants = list(variants)
    for v in list(variants):
        try:
            v.prepare(reference, rtol, atol, min_ms)
        except Exception as exc:  # e.g. an op this torch build lacks
            failed[v.name] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500],
                              "note": v.note}
            log(f"    !!! {v.name}: failed: {failed[v.name]['reason']}")
            variants.remove(v)
            continue
        if not v.checks[-1]["ok"]:
            log(f"    !!! {v.name}: WRONG OUTPUT: {v.checks[-1]['error']}")
    n = len(variants)
    for r in range(rounds if n else 0):
        for v in variants[r % n:] + variants[: r % n]:
            v.measure(min_ms)
            time.sleep(pause_s)
        last = "  ".join(f"{v.name} {v.samples[-1] * 1e3:.4g} ms" for v in variants)
        log(f"    round {r + 1}: {last}")
    for v in variants:
        v.final_check(reference, rtol, atol)
        if not v.checks[-1]["ok"]:
            log(f"    !!! {v.name}: WRONG OUTPUT after timing: {v.checks[-1]['error']}")
    return {v.name: v.result() for v in variants} | failed
