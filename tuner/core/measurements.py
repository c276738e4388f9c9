"""The measurement protocol: what a measurer gets (MeasureInput) and what it gives back
(MeasureResult). Both are plain JSON so they cross process and network boundaries unchanged.

Failures travel as data (an `Invalidity` and an error message), never as exceptions.
`MeasureOptions.from_settings` is the one place the protocol is built from the settings.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.core.config import Settings


class Invalidity(StrEnum):
    OK = "ok"
    BUILD_ERROR = "build_error"
    BUILD_TIMEOUT = "build_timeout"
    RUN_ERROR = "run_error"
    RUN_TIMEOUT = "run_timeout"
    WRONG_ANSWER = "wrong_answer"
    WORKER_LOST = "worker_lost"

    @property
    def is_infrastructure(self) -> bool:
        """Failures of the farm, not of the kernel: retried elsewhere, never train the model."""
        return self is Invalidity.WORKER_LOST


@dataclass(frozen=True)
class MeasureOptions:
    min_repeat_ms: float = 40.0
    repeats: int = 5
    cache_flush: bool = False
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0
    num_threads: int = 1
    verify: bool = True
    # the job's best so far (None: no best yet). Programs with packed weights need a second
    # build to verify: only when the kernel is faster than this. Other programs are always
    # verified.
    verify_below_s: float | None = None
    # a kernel whose first timed repeat is slower than `verify_below_s` times this is not timed
    # again: one repeat is enough to know it is no new best (its record holds that one sample);
    # 0: every kernel is timed `repeats` times
    prune_factor: float = 0.0
    # ... and one whose faster of two repeats is slower than `verify_below_s` times this gets
    # those two (0: no limit after the second repeat)
    confirm_factor: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings, target: dict[str, Any], *,
                      cache_flush: bool | None = None) -> MeasureOptions:
        """The measurement protocol of `settings` for `target`: a kernel runs on
        `settings.num_threads` threads, else the target's num-cores (TVM_NUM_THREADS in the
        sandbox), else 1. `cache_flush` overrides the setting (None keeps it)."""
        threads = settings.num_threads or int(target.get("num-cores") or 1)
        return cls(min_repeat_ms=settings.min_repeat_ms, repeats=settings.repeats,
                   cache_flush=settings.cache_flush if cache_flush is None else cache_flush,
                   build_timeout_s=settings.build_timeout_s, run_timeout_s=settings.run_timeout_s,
                   num_threads=threads, prune_factor=settings.prune_factor,
                   confirm_factor=settings.confirm_factor)


def gflops(flops: float, seconds: float | None) -> float | None:
    """Throughput of a kernel doing `flops` operations in `seconds`; None without a time (or
    without a count: a workload whose operations are not counted)."""
    return flops / seconds / 1e9 if seconds and flops else None


def gbps(nbytes: float, seconds: float | None) -> float | None:
    """Bandwidth of a kernel that reads and writes its parameters once (`nbytes`, the least it
    must move) in `seconds`: GB/s; None without a time or a byte count."""
    return nbytes / seconds / 1e9 if seconds and nbytes else None


# flop per byte below which a kernel is memory-bound when the board's balance (peak GFLOPS over
# peak GB/s) is not declared: CPUs sit at 5-15 (a 2-core Zen 3 VM: 199 / 32 ~ 6); softmax, the
# norms and GEMV are under 1, a 64^3 matmul over 10
DEFAULT_BALANCE = 4.0


def memory_bound(flops: float, nbytes: float, balance: float | None = None) -> bool:
    """Whether a kernel's arithmetic intensity (flops per byte it must move) is under the
    board's balance: its roof is the memory's bandwidth, so GB/s says more than GFLOPS."""
    return nbytes > 0 and flops / nbytes < (balance or DEFAULT_BALANCE)


@dataclass(frozen=True)
class MeasureInput:
    trial_id: str
    workload_key: str
    workload_spec: dict[str, Any]  # tuner.workloads spec: rebuilds the PrimFunc and reference
    target: dict[str, Any]
    trace_json: str
    options: MeasureOptions = field(default_factory=MeasureOptions)
    artifact: str | None = None  # a kernel library already built for this trial, on this host
    # with `artifact`: (shape, dtype) of each of the built kernel's parameters
    # (tuner.measure.builder)
    artifact_params: list[tuple[tuple[int, ...], str]] | None = None
    # with `artifact`: the sha256 (hex) of its bytes; the loading side refuses a library whose
    # bytes hash differently (or that comes without one)
    artifact_sha256: str | None = None
    # what the record of this trial needs besides the result (job_id, workload_id, target_id,
    # space, cand_hash, decisions, features_b64, tvm_version): whoever commits the result (the
    # tuner, or the API for a farm worker) writes the full record from it (tuner.db.rows.NewRecord)
    context: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> MeasureInput:
        d = json.loads(text)
        d["options"] = MeasureOptions(**d.get("options", {}))
        if d.get("artifact_params") is not None:
            d["artifact_params"] = [(tuple(shape), dtype) for shape, dtype in d["artifact_params"]]
        return cls(**d)


@dataclass(frozen=True)
class MeasureResult:
    trial_id: str
    invalidity: Invalidity
    latencies_s: tuple[float, ...] = ()
    error_msg: str | None = None
    build_s: float | None = None
    worker: str | None = None
    max_abs_err: float | None = None

    @property
    def ok(self) -> bool:
        return self.invalidity is Invalidity.OK

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.latencies_s) if self.latencies_s else None

    @property
    def cv(self) -> float | None:
        """Coefficient of variation of the samples (stdev / mean)."""
        if len(self.latencies_s) < 2:
            return None
        mean = statistics.fmean(self.latencies_s)
        return statistics.stdev(self.latencies_s) / mean if mean > 0 else None

    def to_json(self) -> str:
        d = asdict(self)
        d["invalidity"] = str(self.invalidity)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str | bytes) -> MeasureResult:
        d = json.loads(text)
        d["invalidity"] = Invalidity(d["invalidity"])
        d["latencies_s"] = tuple(d.get("latencies_s") or ())
        return cls(**d)

    @classmethod
    def failure(cls, trial_id: str, invalidity: Invalidity, msg: str, **kw: Any) -> MeasureResult:
        return cls(trial_id=trial_id, invalidity=invalidity, error_msg=msg[-4000:], **kw)
