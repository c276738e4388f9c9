"""What the steps of one `Tuner.run` share (tuner.search.loop): the run (`Run`), its search
(`Search`), the best so far (`Best`) and each proposed candidate (`Pick`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedules.naming import KnobNamer
from tuner.core.tvm_api import Target, ms
from tuner.db.rows import TargetRef
from tuner.db.tables import JobState
from tuner.measure import MeasureInput
from tuner.search.costmodel import XGBCostModel
from tuner.search.request import TuneRequest


@dataclass
class Best:
    """The fastest valid record so far: its trial and median."""

    trial_id: str
    median_s: float


@dataclass
class Run:
    """One run of a job: what the steps of `Tuner.run` share and update."""

    req: TuneRequest  # with the space resolved
    job_id: str
    wid: int
    tref: TargetRef
    target: Target  # tvm Target
    space: ms.space_generator.SpaceGenerator.SpaceGeneratorType  # the SpaceGenerator or shorthand
    t0: float  # monotonic
    done: int  # the job's measured trials (infrastructure failures left out)
    best: Best | None  # the fastest valid record of the workload on the target (any job)
    best_at: int  # `done` when the best was found (early stopping)
    measured_now: int = 0
    dups: int = 0  # proposals dropped as measured before this run (this job or the database)
    reproposed: int = 0  # proposals dropped as measured earlier in this run
    over: bool = False  # nothing to measure: `_start` left the job in its final state
    stop: str = "budget reached"
    final: JobState = JobState.SUCCEEDED
    namer: KnobNamer = field(default_factory=KnobNamer)  # a candidate's knob values by name


@dataclass
class Search:
    """The search side of a run: MetaSchedule's tune context and evolutionary search, tunefarm's
    cost model, the database seeding the population, and every candidate hash measured so far."""

    ctx: ms.TuneContext
    strategy: ms.search_strategy.EvolutionarySearch
    model: XGBCostModel
    memdb: ms.database.MemoryDatabase
    token: ms.database.Workload  # the workload's token in `memdb`
    args_info: list[ms.arg_info.ArgInfo]
    measured: set[str]
    measured_before: frozenset[str]  # `measured` when the run started
    related: list[ms.MeasureCandidate]  # the first batch's head: related workloads' schedules
    dup_batches: int = 0  # batches in a row with nothing new
    evolves: bool = True  # False once TVM's evolution failed on this program: sample instead


@dataclass(frozen=True)
class Pick:
    """A proposed candidate to measure: its schedule, hash, features and input."""

    cand: ms.MeasureCandidate
    cand_hash: str
    features: np.ndarray
    inp: MeasureInput
