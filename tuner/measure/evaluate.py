"""What a measurer does with a built kernel on a device, local (tuner.measure.sandbox) or remote
(tuner.measure.rpc): the workload's inputs and reference outputs, allocating the arguments on the
device, running and checking against the reference, and timing with the protocol's options.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.measure.packing import Packer

if TYPE_CHECKING:
    from tuner.core.measurements import MeasureOptions
    from tuner.core.tvm_api import RuntimeModule, Tensor, tvm


class Prepared:
    """A workload's inputs and reference outputs, computed once per process per workload."""

    def __init__(self, spec: dict[str, Any], seed: int = 0) -> None:
        from tuner.workloads import parse_spec

        self.workload = parse_spec(spec)
        self.seed = seed
        self.mod = self.workload.mod()
        self.inputs = self.workload.make_inputs(seed)
        self.arg_specs = self.workload.arg_specs()
        self.rtol, self.atol = self.workload.tolerance()
        self.reference: list[np.ndarray] | None = None
        self.fill: str | None = None  # how a candidate's outputs start (`ensure_fill`)
        self._packer: Packer | None = None

    @property
    def packer(self) -> Packer:
        """Packs the inputs for kernels that take their weights packed (`tuner.measure.packing`)."""
        if self._packer is None:
            self._packer = Packer(self.inputs, self.arg_specs)
        return self._packer

    def ensure_reference(self, send: Callable[[dict[str, Any]], None],
                         trial_id: str) -> list[np.ndarray]:
        if self.reference is None:
            send({"trial_id": trial_id, "phase": "preparing"})
            self.reference = self.workload.reference(self.inputs)
        return self.reference

    def ensure_fill(self) -> str:
        """How a candidate's outputs start: sentinels (NaN), so that an element it never writes
        fails its check, unless the workload itself reads an output before writing it (a `tir`
        workload whose reference differs on sentinel outputs): zeros then, as its reference."""
        if self.fill is None:
            self.fill = "sentinel" if self.workload.op != "tir" or _same(
                self.workload.reference(self.inputs, fill="sentinel"),
                self.ensure_reference(lambda _msg: None, "")) else "zeros"
        return self.fill


class ArtifactError(Exception):
    """A built library that is not what the builder produced: refused, never loaded."""


def checked_bytes(path: str, sha256: str | None) -> bytes:
    """The bytes of the built library at `path`, read once, if they hash to `sha256` (what the
    builder recorded); ArtifactError otherwise. Load exactly these bytes: a file swapped after
    the check is never read again."""
    name = os.path.basename(path)
    if not sha256:
        raise ArtifactError(f"artifact {name} comes without a sha256")
    with open(path, "rb") as f:
        data = f.read()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ArtifactError(f"artifact hash mismatch: {name} has sha256 {got[:16]}..., expected "
                            f"{sha256[:16]}...; not loaded")
    return data


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # TVM errors end with the meaningful line; keep the head and the tail
    if len(lines) > 6:
        lines = [*lines[:2], "...", *lines[-3:]]
    return f"{type(exc).__name__}: " + " | ".join(lines)[:2000]


def check(outputs: list[np.ndarray], reference: list[np.ndarray], rtol: float,
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


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127), size=shape).astype(dtype)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


# Calls per repeat are sized for this multiple of min_repeat_ms ...
CALIBRATION_HEADROOM = 1.1
# ... and TVM re-runs a repeat only when it lasted less than this fraction of min_repeat_ms.
REPEAT_FLOOR = 0.5
# The first repeat of a kernel that races the job's best (the one the first limit reads) lasts
# this fraction of min_repeat_ms: most candidates get no other (`time_kernel`).
SCREEN_FRACTION = 0.5


def time_kernel(rt: RuntimeModule, args: list[Tensor], opts: MeasureOptions,
                dev: tvm.runtime.Device) -> tuple[float, ...]:
    """`opts.repeats` samples (seconds per call) with TVM's `time_evaluator`: each repeat runs the
    kernel for about `min_repeat_ms` (see `calls_per_repeat`), or once after a CPU cache flush with
    `cache_flush`. A kernel races the job's best (`prune_limits`): one whose first repeat is
    slower than the first limit gets that one only; one whose faster of two repeats is slower
    than the second gets those two. While it races, a kernel whose repeat is many calls also
    stops as soon as more than half of its repeats are slower than the best (`cannot_win`).
    Either way it cannot be the new best.

    What pruning saves, measured on a 2-core Zen 4: a candidate costs ~260 ms to time with 5
    repeats of 40 ms, ~90 ms with one; in the fused suite's F5, F10 and F22 (templates, 64
    trials) 3, 4 and 8 candidates were more than 1.5x slower than the best known then. The
    default limits (1.2, then 1.05: `tuner.core.config.Settings`) come from nine fused-suite jobs
    on a
    2-core Zen 4, 527 candidates timed 5 times each. A first repeat read more than 20% above its
    candidate's median 7 times (a cold start), the faster of the first two more than 5% above it
    9 times: the second limit can be the tighter. Replayed (`python -m bench.racing`) under
    (1.2, 1.05) the jobs took 9% fewer repeats than under (1.5, 1.1), the same best kernel in
    each, and 2 candidates within 1% of the best of their time were cut short; (1.1, 1.03) took
    20% fewer, and cut 4 such. (1.2, 1.03) took 14% fewer and cut the same 2: the second limit is
    kept at 1.05 as a margin for machines noisier than that one.

    The first repeat of a racing kernel is a screen half as long (`SCREEN_FRACTION`). Nine
    fused-suite jobs on a 2-core Zen 4 (527 candidates, each timed as ten 20 ms halves) replayed
    with full and half first repeats (`python -m bench.racing DIR --halves`): the half screen
    took 20% less timing, and its picks were as close to the best of each job (0.48% slower on
    average against 0.54%; the worst 2.1% in both)."""
    if opts.cache_flush:
        # number=1 so every timed run starts with cold caches (TVM flushes all args but the first)
        kw: dict[str, Any] = {"number": 1, "f_preproc": "cache_flush_cpu_non_first_arg"}
        screen = kw
    else:
        number = calls_per_repeat(rt, args, opts.min_repeat_ms, dev)
        kw = {"number": number, "min_repeat_ms": math.ceil(REPEAT_FLOOR * opts.min_repeat_ms)}
        screen = {"number": max(1, math.ceil(SCREEN_FRACTION * number)),
                  "min_repeat_ms": math.ceil(REPEAT_FLOOR * SCREEN_FRACTION * opts.min_repeat_ms)}

    def timed(repeats: int, short: bool = False) -> tuple[float, ...]:
        ev = rt.time_evaluator("main", dev, repeat=repeats, **(screen if short else kw))
        return tuple(float(x) for x in ev(*args).results)

    # past the limits, repeats are timed in as few calls as still let `cannot_win` end the timing,
    # and only where a repeat is many calls: every time_evaluator call runs the kernel once more,
    # untimed, first
    return race(timed, opts, stepwise=kw["number"] > 1)


def race(timed: Callable[..., tuple[float, ...]], opts: MeasureOptions, *,
         stepwise: bool = True) -> tuple[float, ...]:
    """The samples `time_kernel` takes of a kernel: `timed(n)` times n more repeats, and
    `timed(1, short=True)` the screen (the first repeat, which the first limit reads); the race
    against `opts.verify_below_s` (the job's best) decides how many in all (`bench.racing`
    replays it on recorded samples). `stepwise`: past the limits, time only as many at once as
    `cannot_win` needs to end the race (else all that are left)."""
    repeats = max(opts.repeats, 1)
    limits = prune_limits(opts)
    stepwise = stepwise and bool(limits)
    samples: tuple[float, ...] = ()
    while len(samples) < repeats:
        i = len(samples)
        if i < len(limits):
            limit = limits[i]
            samples += timed(1, short=i == 0 and limit is not None)
            if limit is not None and min(samples) > limit:
                return samples  # no new best: the other repeats would only say how slow
        else:
            samples += timed(next_chunk(samples, repeats, opts.verify_below_s) if stepwise
                             else repeats - i)
        if stepwise and cannot_win(samples, repeats, opts.verify_below_s):
            return samples
    return samples


def next_chunk(samples: tuple[float, ...], repeats: int, best: float | None) -> int:
    """How many repeats to time at once: the fewest after which `cannot_win` could end the
    timing, or all that are left where it no longer can."""
    left = repeats - len(samples)
    slower = sum(s > best for s in samples) if best is not None else 0
    needed = repeats // 2 + 1 - slower
    return needed if best is not None and 0 < needed <= left else left


def cannot_win(samples: tuple[float, ...], repeats: int, best: float | None) -> bool:
    """Whether the median of `repeats` samples must come out above `best` whatever the samples
    not yet taken read: once more than half of them are slower than the best, the median is
    too, so the kernel is no new best (the job keeps the faster median) and its timing can end
    with no effect on which kernel wins."""
    return best is not None and sum(s > best for s in samples) > repeats // 2


def prune_limits(opts: MeasureOptions) -> tuple[float | None, ...]:
    """The times per call above which a kernel's fastest sample ends its timing: after its first
    repeat (`MeasureOptions.prune_factor` times the job's best so far) and after its second
    (`confirm_factor` times it). A factor of 0 gives None (no limit after that repeat), and
    trailing Nones are dropped: empty when every repeat is timed at once."""
    best = opts.verify_below_s
    if best is None:
        return ()
    limits = [float(best) * float(f) if f and f > 0 else None
              for f in (opts.prune_factor, opts.confirm_factor)]
    while limits and limits[-1] is None:
        limits.pop()
    return tuple(limits)


def calls_per_repeat(rt: RuntimeModule, args: list[Tensor], min_repeat_ms: float,
                     dev: tvm.runtime.Device) -> int:
    """How many calls make a repeat last `min_repeat_ms` (plus 10%), from a probe of ~1/8 of a
    repeat.

    Left to itself (number=1, min_repeat_ms), `time_evaluator` finds that count inside every
    repeat: it grows `number` by 1.618x steps and runs a whole repeat again whenever one falls
    short of `min_repeat_ms`, keeping the grown count for the later repeats. Kernels here vary
    5-60% from one repeat to the next, so that happens to about half the repeats: measured on a
    35 µs kernel, 5 repeats of 40 ms took 291 ms instead of 200. With the count sized once and
    re-runs only below REPEAT_FLOOR of `min_repeat_ms` (a kernel twice as fast as probed), each
    repeat lasts about `min_repeat_ms` and 5 of them take ~230 ms.
    """
    if min_repeat_ms <= 0:
        return 1
    t0 = time.perf_counter()
    rt["main"](*args)
    dev.sync()
    if (time.perf_counter() - t0) * 1e3 >= min_repeat_ms:
        return 1  # one call fills a repeat: nothing to calibrate
    probe = rt.time_evaluator("main", dev, number=1, repeat=1,
                              min_repeat_ms=max(1, math.ceil(min_repeat_ms / 8)))
    per_call_ms = float(probe(*args).mean) * 1e3
    if per_call_ms <= 0:
        return 1
    return max(1, math.ceil(CALIBRATION_HEADROOM * min_repeat_ms / per_call_ms))


def run_and_check(rt: RuntimeModule, prep: Prepared, send: Callable[[dict[str, Any]], None],
                  trial_id: str, dev: tvm.runtime.Device, inputs: list[Tensor] | None = None
                  ) -> tuple[list[Tensor], bool, float | None, str | None]:
    """Run the program on the workload's inputs (or `inputs`, e.g. with packed weights; outputs
    filled with sentinels: `Prepared.fill`) and compare with the reference."""
    n_in = len(prep.inputs)
    args = allocate(prep, dev, inputs, fill=prep.fill or "sentinel")
    rt["main"](*args)  # the kernel first: one that hangs or crashes never waits for the reference
    outputs = [a.numpy() for a in args[n_in:]]
    reference = prep.ensure_reference(send, trial_id)
    send({"trial_id": trial_id, "phase": "running"})
    ok, max_err, why = check(outputs, reference, prep.rtol, prep.atol)
    if not ok and prep.fill is None and prep.ensure_fill() == "zeros":
        # the workload reads its outputs: again from zeroed ones, as its reference ran
        args = allocate(prep, dev, inputs, fill="zeros")
        rt["main"](*args)
        ok, max_err, why = check([a.numpy() for a in args[n_in:]], reference, prep.rtol,
                                 prep.atol)
    return args, ok, max_err, why


def allocate(prep: Prepared, dev: tvm.runtime.Device, inputs: list[Tensor] | None = None,
             fill: str = "zeros") -> list[Tensor]:
    """The workload's inputs (or `inputs`, already on `dev`) and its outputs on `dev`, zeroed
    or filled with sentinels (`tuner.workloads.tir.output_fill`)."""
    from tuner.core import tvm_api as tv
    from tuner.workloads.tir import output_fill

    args = list(inputs) if inputs is not None else [tv.tvm.runtime.tensor(a, dev)
                                                     for a in prep.inputs]
    for _, shape, dtype in prep.arg_specs[len(prep.inputs):]:
        args.append(tv.tvm.runtime.tensor(output_fill(tuple(shape), dtype, fill), dev))
    return args


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))


def random_args(specs: list[tuple[tuple[int, ...], str]], dev: tvm.runtime.Device,
                seed: int = 0) -> list[Tensor]:
    """Arguments of a kernel that takes pre-packed weights (timed, not verified)."""
    from tuner.core import tvm_api as tv

    rng = np.random.default_rng(seed)
    return [tv.tvm.runtime.tensor(random_array(rng, shape, dtype), dev) for shape, dtype in specs]
