"""What a caller hands `Tuner.run` (`TuneRequest`), what it hears while the search runs
(`Progress`) and what it gets back (`TuneSummary`); and the trial id of a candidate in a job."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.measure import MeasureOptions, MeasureResult
from tuner.workloads import Workload

if TYPE_CHECKING:
    from tuner.search.task import ResolvedTask


@dataclass(frozen=True)
class TuneRequest:
    workload: Workload
    target: dict[str, Any]  # canonical target dict (tuner.core.tvm_api.target_to_dict)
    trials: int
    device_key: str = "local"
    space: str = "default"  # a template name, "auto", or "default" (best that applies)
    batch_size: int = 16
    early_stop: int | None = None  # stop after this many measured trials without a new best
    seed: int = 0
    fresh: bool = False  # start a new job instead of resuming the last one
    options: MeasureOptions = field(default_factory=MeasureOptions)
    job_id: str | None = None  # service: run exactly this (queued or resumed) job
    # the workload, target and space already registered and resolved (`tuner.search.task`):
    # handed down by whoever made it; without it the loop resolves the fields above itself
    task: ResolvedTask | None = None


@dataclass(frozen=True)
class Progress:
    job_id: str
    done: int
    total: int
    best_s: float | None = None
    best_gflops: float | None = None
    last: MeasureResult | None = None
    message: str = ""


@dataclass
class TuneSummary:
    job_id: str
    workload_key: str
    target_key: str
    trials_done: int
    measured_now: int
    skipped_duplicates: int  # proposals measured before this run (this job or the database)
    stop_reason: str
    wall_s: float
    best_trial: str | None
    best_s: float | None
    best_gflops: float | None
    counts: dict[str, int]
    reproposed: int = 0  # proposals the search made again after this run measured them


def trial_id(job_id: str, cand_hash: str) -> str:
    return hashlib.sha256(f"{job_id}|{cand_hash}".encode()).hexdigest()[:32]


