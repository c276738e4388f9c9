"""ReplayMeasurer: measures nothing; answers each candidate from recorded results, like Kernel
Tuner's `SimulationRunner`. With it `Tuner.run` runs a whole search in seconds without building
or timing a kernel: to test the search over every template, or to compare search changes on the
measurements of an earlier run.

A candidate is known by its program's structural hash (`inp.context["cand_hash"]`, the key the
tuning database dedups by), so a recording made by one job answers every later job of the same
workload and target, in any database. The answer is the recorded result under the new input's
trial id. Infrastructure failures (WORKER_LOST) are never part of a recording: nothing was
measured.

A candidate missing from the recording goes to `fallback(inp)` when there is one (e.g. a
synthetic latency, or a real measurer). Without one, `measure_one` raises `NotRecorded`, which
stops the run (the search loop marks the job FAILED with the message). A made-up failure would
be dishonest: a RUN_ERROR would train the cost model on a kernel failure that never happened and
be stored as a measurement, a WORKER_LOST would be retried and then fail the job as a dead farm.
The recording simply cannot answer; the caller must know.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tuner.core.errors import NotFound
from tuner.core.measurements import Invalidity, MeasureInput, MeasureResult

from .measurer import Measurer

if TYPE_CHECKING:
    from tuner.db.rows import RecordRow
    from tuner.db.store import Store

Fallback = Callable[[MeasureInput], MeasureResult]


class NotRecorded(NotFound):
    """A replay was asked for a candidate its recording does not hold, and has no fallback."""

    code = "not_recorded"


def result_of(row: RecordRow) -> MeasureResult:
    """The MeasureResult a stored record stands for."""
    return MeasureResult(trial_id=row.trial_id, invalidity=row.invalidity,
                         latencies_s=tuple(row.latencies or ()), error_msg=row.error_msg,
                         build_s=row.build_s, worker=row.worker)


class ReplayMeasurer(Measurer):
    """Answers from `recording` (cand_hash -> result), else from `fallback(inp)`, else raises
    `NotRecorded` (see the module docstring). `answered` holds every answer given, by trial id.
    A result keeps its recorded `worker`; one without gets `worker`."""

    def __init__(self, recording: Mapping[str, MeasureResult] | None = None, *,
                 fallback: Fallback | None = None, worker: str = "replay") -> None:
        self.recording: dict[str, MeasureResult] = {
            h: res for h, res in (recording or {}).items()
            if res.invalidity is not Invalidity.WORKER_LOST}
        self.fallback = fallback
        self.worker = worker
        self.answered: dict[str, MeasureResult] = {}
        self.replayed = 0  # answers from the recording
        self.fell_back = 0  # answers from the fallback

    @classmethod
    def from_store(cls, store: Store, *, workload_key: str, target_key: str,
                   fallback: Fallback | None = None) -> ReplayMeasurer:
        """A replay of every record of the workload on the target in `store` (any job). With
        several records of a candidate, a valid one wins, the fastest of them."""
        recording: dict[str, MeasureResult] = {}
        wrow, tref = store.workload_by_key(workload_key), store.target_by_key(target_key)
        if wrow is not None and tref is not None:
            for row in store.records(workload_id=wrow.id, target_id=tref.id):
                res = result_of(row)
                if res.invalidity is Invalidity.WORKER_LOST:
                    continue
                old = recording.get(row.cand_hash)
                if old is None or _better(res, old):
                    recording[row.cand_hash] = res
        return cls(recording, fallback=fallback)

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        cand_hash = (inp.context or {}).get("cand_hash")
        recorded = self.recording.get(cand_hash) if cand_hash else None
        if recorded is not None:
            self.replayed += 1
            res = replace(recorded, trial_id=inp.trial_id, worker=recorded.worker or self.worker)
        elif self.fallback is not None:
            self.fell_back += 1
            res = replace(self.fallback(inp), trial_id=inp.trial_id)
            res = res if res.worker else replace(res, worker=self.worker)
        else:
            raise NotRecorded(f"candidate {cand_hash or '(no cand_hash)'} of trial "
                              f"{inp.trial_id} is not in the recording and the replay has no "
                              "fallback")
        self.answered[inp.trial_id] = res
        return res


def _better(a: MeasureResult, b: MeasureResult) -> bool:
    if a.ok != b.ok:
        return a.ok
    return a.ok and (a.median_s or 0.0) < (b.median_s or 0.0)
