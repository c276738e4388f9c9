"""The `Measurer` interface: how the search loop (and a farm worker) gets candidates measured,
without knowing where they run."""

from __future__ import annotations

import abc
from typing import ClassVar, Self

from tuner.core.measurements import MeasureInput, MeasureResult


class Measurer(abc.ABC):
    """Measures candidates: builds each `MeasureInput`'s program, verifies it against the
    workload's reference and times it, on whatever board the implementation stands for.

    Implementations: `tuner.measure.local.LocalMeasurer` (this machine, in a sandbox process),
    `tuner.measure.rpc.RpcMeasurer` (boards behind a TVM RPC tracker), `tuner.measure.remote.
    RemoteMeasurer` (the farm, through Redis and the API), `tuner.measure.replay.ReplayMeasurer`
    (recorded results, no hardware). The contract every one of them keeps (and
    `tests/support/measurer_contract.py` checks):

    Failures are data.
        `measure_one` never raises for anything a kernel does: a trace that does not apply or a
        compile error is BUILD_ERROR, past the build deadline BUILD_TIMEOUT; a kernel that
        crashes is RUN_ERROR, one past the run deadline RUN_TIMEOUT, wrong outputs
        WRONG_ANSWER; the measurer keeps working after each of them. It returns a result whose
        `trial_id` is the input's.
    WORKER_LOST is the farm's failure, not the kernel's.
        A board or process that went away, no free board, a dead tracker, nobody measured it in
        time: the candidate was not measured. The caller retries it elsewhere (under an attempt
        id of its own, so the trial id stays free for the real result); it never counts against
        the budget and never trains the cost model.
    Exceptions are for the caller's process only.
        `measure_one` may raise when the run itself must stop, never for a candidate: e.g.
        `tuner.core.errors.JobHandedOff` (the tuner is stopping; another resumes the job), or
        `tuner.measure.replay.NotRecorded` (a replay asked for what it never recorded).
    `prepare(inputs)` is a hint.
        It sees a batch before its candidates are measured one by one, and may start work for
        all of them: build them in parallel (local, RPC), hand them to the farm (remote). It
        never returns results. `measure_one` may be called for inputs never prepared (it then
        does all the work itself), and a prepared input may never be measured (the search
        stopped): `close` releases what `prepare` left.
    One thread at a time.
        A measurer is not thread-safe: one caller measures with it at a time (a worker
        process, a tuner's job). To measure in parallel, use one measurer per thread or
        `prepare` a batch.
    `probe()` answers whether the board works (a quarantined worker asks before taking work
        again); it must not raise. `close()` releases processes and files; the measurer is a
        context manager that closes on exit.
    """

    commits_records: ClassVar[bool] = False
    """True when the measurement path itself commits each result to the tuning database (the
    farm: the API's results endpoint writes it); the search loop then never writes that record
    again."""

    @abc.abstractmethod
    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        """Measure one candidate; its result (a failure as data), under `inp.trial_id`."""

    def prepare(self, inputs: list[MeasureInput]) -> None:  # noqa: B027 - optional hook
        """See the batch before it is measured (default: nothing to do)."""

    def probe(self) -> bool:
        """Health probe: can this measurer measure now? (default: yes)"""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release processes, files and queued work (default: nothing to release)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
