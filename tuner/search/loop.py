"""The search loop: propose a batch (model-guided evolutionary search), drop what was already
measured for this workload and target, measure the rest, commit every result to SQL as it
arrives, retrain the cost model, repeat until the budget or early stopping.

MetaSchedule's `EvolutionarySearch` does the proposing (its mutators, its sampling of the design
space); tunefarm owns everything around it: the budget counts real measurements only, dedup spans
every job that ever ran on this workload and target, the cost model is tunefarm's and starts from
the whole target's history, and a job killed at any point resumes from its committed records.

`Tuner.run` is these steps, in this order:

    _start          register the workload and target, resolve the space, find or create the job,
                    count its committed trials (a resumed job goes on from there), mark it
                    RUNNING, or return at once (cancelled, budget already spent)
    _search         the tune context, the cost model (trained on the target's history), the
                    population seeded from the best records, and (a job with no records of its
                    own) the best schedules of related workloads, adapted to this one
    per batch:
      _propose      sample the space (untrained model) or evolve; drop what was measured
      _measure_batch  prepare, then measure one by one; each result through `_measure`, which
                    writes its record (unless the measurer's path commits it: the farm) and
                    retries an infrastructure failure; then
        _commit     count it, add a valid one to the search's database, update the best
      _learn        retrain the cost model, tell the search what was measured
    _finish         the job's final state and the summary

Failures: `JobHandedOff` (the tuner is stopping; another resumes the job) leaves the job's state
alone; anything else marks the job FAILED and propagates.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import numpy as np

from schedules.registry import knob_namer, search_strategy, space_generator
from tuner.core import tvm_api as tv
from tuner.core.config import get_settings
from tuner.core.errors import JobHandedOff, TunefarmError
from tuner.db.jobs import LOCAL_OWNER, JobOptions, NewJob, create_job
from tuner.db.rows import JobRow, TargetRef
from tuner.db.store import NewRecord, Store
from tuner.db.tables import JobState
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult, gflops
from tuner.search import farm_model, transfer
from tuner.search.history import seed_database, trained_cost_model
from tuner.search.request import Progress, TuneRequest, TuneSummary, trial_id
from tuner.search.sampling import interleave, sample_space
from tuner.search.state import Best, Pick, Run, Search
from tuner.search.task import CanonicalTarget, ResolvedTask, TaskResolver

log = logging.getLogger(__name__)

MAX_LOST_IN_A_ROW = 3  # consecutive infrastructure failures before the job fails


class Tuner:
    def __init__(self, store: Store, measurer: Measurer, *,
                 on_progress: Callable[[Progress], None] | None = None,
                 should_stop: Callable[[], str | None] | None = None,
                 seed_top_k: int = 32, max_dup_batches: int = 8) -> None:
        """`should_stop` is asked after every measured candidate: None goes on, "cancelled" stops
        with the job CANCELLED, any other text stops it SUCCEEDED with that reason."""
        self._lost_in_a_row = 0
        self.store = store
        self.measurer = measurer
        self.on_progress = on_progress or (lambda p: None)
        self.should_stop = should_stop or (lambda: None)
        self.seed_top_k = seed_top_k
        self.max_dup_batches = max_dup_batches

    # ------------------------------------------------------------------ setup
    def _task(self, req: TuneRequest) -> ResolvedTask:
        """The request's resolved task: handed down, or made here (a bad space fails before
        any job exists; the job is keyed by the resolved space)."""
        if req.task is not None:
            if req.task.workload.key != req.workload.key:
                raise TunefarmError("the request's task is not its workload's")
            return req.task
        return TaskResolver(self.store).task(req.workload, CanonicalTarget.of(req.target),
                                             req.device_key, req.space)

    def _job(self, req: TuneRequest, wid: int, tref: TargetRef) -> JobRow:
        """The service's job (`req.job_id`), or the embedded CLI's: created through
        `tuner.db.jobs.create_job` like a REST job (owner LOCAL_OWNER), resuming the latest
        job of the same key unless `req.fresh`."""
        if req.job_id is not None:
            job = self.store.get_job(req.job_id)
            if job is None:
                raise TunefarmError(f"no job {req.job_id!r}")
            return job
        return create_job(self.store, NewJob(
            workload_id=wid, workload_key=req.workload.key, target=tref, space=req.space,
            trials=req.trials, options=JobOptions(req.batch_size, req.seed, req.early_stop),
            lease_owner=LOCAL_OWNER, resume=not req.fresh))

    # ------------------------------------------------------------------ run
    def run(self, req: TuneRequest) -> TuneSummary:
        """Tune `req` until its budget, early stopping, `should_stop` or an exhausted space."""
        run = self._start(req)
        if run.over:
            return self._summary(run)
        try:
            search = self._search(run)
            while run.done < run.req.trials:
                picks = self._propose(run, search)
                if picks is None:
                    break
                measured, halt = self._measure_batch(run, search, picks)
                self._learn(run, search, measured)
                if self._stopping(run, halt):
                    break
            search.strategy.post_tuning()
        except JobHandedOff:
            raise  # e.g. a service tuner stopping or losing its lease: another resumes the job
        except BaseException as exc:
            msg = ("interrupted" if isinstance(exc, KeyboardInterrupt)
                   else f"{type(exc).__name__}: {exc}")
            self.store.set_job_state(run.job_id, JobState.FAILED, error=msg[:2000])
            raise
        return self._finish(run)

    def _start(self, req: TuneRequest) -> Run:
        """The job of `req` (found, resumed or created) with its committed trials counted, and
        RUNNING; or `over` (cancelled, budget already spent) in its final state."""
        t0 = time.monotonic()
        task = self._task(req)
        wid, tref, target = task.workload_id, task.target_ref, task.target.target
        req = replace(req, space=task.space, task=task)
        space = space_generator(req.space, req.workload, target)
        job = self._job(req, wid, tref)
        done = sum(1 for r in self.store.records(job_id=job.id)
                   if r.invalidity != Invalidity.WORKER_LOST)
        best = next((Best(r.trial_id, r.median_s) for r in self.store.best(wid, tref.id, k=1)
                     if r.median_s is not None), None)
        run = Run(req=req, job_id=job.id, wid=wid, tref=tref, target=target, space=space,
                  t0=t0, done=done, best=best, best_at=done,
                  namer=knob_namer(req.space, req.workload, target))
        reopen = req.job_id is None  # the CLI resumes and extends finished jobs
        if job.state is JobState.CANCELLING:
            self.store.set_job_state(job.id, JobState.CANCELLED)
            run.over, run.stop = True, "cancelled"
            self._report(run, message="cancelled")
        elif done >= req.trials:
            if job.state is JobState.QUEUED:
                self.store.set_job_state(job.id, JobState.RUNNING)
            self.store.set_job_state(job.id, JobState.SUCCEEDED, reopen=reopen)
            run.over, run.stop = True, "budget already spent"
            self._report(run, message="budget already spent: nothing to measure")
        else:
            self.store.set_job_state(job.id, JobState.RUNNING, reopen=reopen)
            self._report(run, message="resuming" if done else "starting")
        return run

    def _search(self, run: Run) -> Search:
        """The tune context, the cost model and the evolutionary search, ready to propose."""
        req = run.req
        mod = req.workload.mod()
        ctx = tv.tune_context(mod, run.target, space=run.space,
                              strategy=search_strategy(req.space),
                              seed=req.seed, num_threads=max(1, req.options.num_threads))
        model = trained_cost_model(self.store, run.tref, run.wid, req.seed)
        # `search_strategy` makes an EvolutionarySearch
        strategy = cast(tv.ms.search_strategy.EvolutionarySearch, ctx.search_strategy)
        memdb = seed_database(self.store, run.wid, run.tref, mod, run.target, req.space,
                              self.seed_top_k)
        args_info = tv.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        token = memdb.commit_workload(mod)
        # measured programs this search did not propose (sampled, or from earlier jobs) join
        # its population from `memdb` and can fill that many of its picks: ask for more
        overlap = int(strategy.population_size * strategy.init_measured_ratio)
        strategy.pre_tuning(max_trials=1 << 30, num_trials_per_iter=req.batch_size + overlap,
                            design_spaces=tv.design_spaces(ctx), database=memdb,
                            cost_model=cast(tv.ms.cost_model.CostModel, model))  # derived object
        related: list[tv.ms.MeasureCandidate] = []
        if model.size == 0 and get_settings().cost_model_transfer:
            related = [t.cand for t in transfer.candidates(
                self.store, run.tref, run.wid, req.space, ctx, args_info,
                transfer.share(req.batch_size), flops=req.workload.flops)]
        before = frozenset(self.store.measured(run.wid, run.tref.id))
        return Search(ctx=ctx, strategy=strategy, model=model, memdb=memdb, token=token,
                      args_info=args_info, measured=set(before), measured_before=before,
                      related=related)

    def _propose(self, run: Run, search: Search) -> list[Pick] | None:
        """The next batch: candidates never measured on this workload and target (none in a
        batch twice), at most the batch size and the budget left. None (with `run.stop`) when
        the search has nothing new to offer."""
        req = run.req
        # an untrained model scores at random: evolving a population by its scores only
        # costs replays, so the first batch samples the space directly; a model that knows
        # only other workloads (the farm's) picks half of it, random samples the other half
        # (where it transfers badly, they keep the batch from its blind spot)
        model = search.model
        if not model.trained or not search.evolves:
            cands = sample_space(search.strategy, search.args_info, req.batch_size)
        else:
            try:
                evolved = search.strategy.generate_measure_candidates()
            except Exception as exc:  # TVM's evolution failed on this program: sample it
                # (seen: GPT-2's position-id gather, "args.size() ==
                # initial_indices_orig.size()" in the evolution's parallel loop)
                log.warning("job %s: the evolutionary search failed (%s); sampling the space "
                            "from now on", run.job_id, str(exc).strip().splitlines()[-1][:200])
                evolved, search.evolves = None, False
            samples = (sample_space(search.strategy, search.args_info, req.batch_size)
                       if model.size == 0 or evolved is None else [])
            cands = interleave(list(evolved or []), samples)
        # a job with no measurements of its own: related workloads' best schedules, adapted
        # (tuner.search.transfer), head its first batch
        cands, search.related = search.related + list(cands or []), []
        if not cands:
            run.stop = "search space exhausted"
            return None
        fresh: list[tuple[Any, str]] = []
        seen: set[str] = set()
        for c in cands:
            h = tv.shash_hex(c.sch.mod)
            if h in search.measured_before:
                run.dups += 1  # measured before this run (this job or the database): skipped
            elif h in search.measured:
                run.reproposed += 1  # the search proposed again what this run measured
            elif h not in seen:  # the same program proposed twice in one batch: once
                fresh.append((c, h))
                seen.add(h)
        fresh = fresh[: min(req.batch_size, req.trials - run.done)]
        search.dup_batches = 0 if fresh else search.dup_batches + 1
        if search.dup_batches >= self.max_dup_batches:
            run.stop = "search keeps proposing measured candidates"
            return None
        feats = search.model.features(search.ctx, [c for c, _ in fresh])
        predicted = search.model.predicted_latency(feats, run.best.median_s if run.best else None)
        return [Pick(c, h, x, self._input(req, run, c, h, x, p))
                for (c, h), x, p in zip(fresh, feats, predicted, strict=True)]

    def _measure_batch(self, run: Run, search: Search,
                       picks: list[Pick]) -> tuple[list[tuple[Pick, MeasureResult]], str | None]:
        """Measure a batch (prepared as a whole, e.g. built in parallel), committing each result
        as it arrives. Returns the measured picks (infrastructure failures left out: they may
        come back, never train) and why the run must stop now, if it must."""
        self.measurer.prepare([p.inp for p in picks])
        measured: list[tuple[Pick, MeasureResult]] = []
        halt: str | None = None
        for p in picks:
            opts = replace(run.req.options, verify_below_s=run.best.median_s if run.best else None)
            res = self._measure(replace(p.inp, options=opts))
            if res.invalidity == Invalidity.WORKER_LOST:
                halt = self.should_stop()  # not measured: may come back, never trains
                if halt:
                    break
                continue
            measured.append((p, res))
            self._commit(run, search, p, res)
            halt = self.should_stop()
            if halt or self._early_stop(run):
                break
        return measured, halt

    def _commit(self, run: Run, search: Search, pick: Pick, res: MeasureResult) -> None:
        """A measured trial (its record is already written): count it, give a valid one to the
        search's database, update the best and report progress."""
        search.measured.add(pick.cand_hash)
        run.done += 1
        run.measured_now += 1
        if res.ok and res.median_s is not None:
            search.memdb.commit_tuning_record(tv.ms.database.TuningRecord(
                trace=cast(tv.Trace, pick.cand.sch.trace),  # the search's schedules are traced
                workload=search.token, run_secs=[res.median_s],
                target=run.target, args_info=search.args_info))
            if run.best is None or res.median_s < run.best.median_s:
                run.best = Best(res.trial_id, res.median_s)
                run.best_at = run.done
        self._report(run, res)

    @staticmethod
    def _learn(run: Run, search: Search,
               measured: list[tuple[Pick, MeasureResult]]) -> None:
        """Retrain the cost model on the batch's results and tell the search what was measured
        (a failure as a very slow run)."""
        lats = [res.median_s if res.ok else None for _, res in measured]
        # an emulated board's latencies are emulation's: no cost model learns from them (the
        # search samples its space as an untrained model ranks it)
        if measured and not get_settings().emulated(run.tref.device_key):
            search.model.add(np.stack([p.features for p, _ in measured]), lats, group=run.wid)
            search.model.fit()
        search.strategy.notify_runner_results(
            [p.cand for p, _ in measured],
            [tv.ms.runner.RunnerResult(run_secs=[lat or 1e10], error_msg=None) for lat in lats])

    @staticmethod
    def _early_stop(run: Run) -> bool:
        return bool(run.req.early_stop and run.done - run.best_at >= run.req.early_stop)

    def _stopping(self, run: Run, halt: str | None) -> bool:
        """After a batch: must the run stop (`should_stop` said so, or early stopping)?"""
        if halt:
            run.stop = halt
            run.final = JobState.CANCELLED if halt == "cancelled" else JobState.SUCCEEDED
            return True
        if self._early_stop(run):
            run.stop = f"early stop: no new best in {run.req.early_stop} trials"
            return True
        return False

    def _finish(self, run: Run) -> TuneSummary:
        self.store.set_job_state(run.job_id, run.final)
        self._report(run, message=run.stop)
        if run.measured_now and get_settings().cost_model_transfer:
            farm_model.refresh_after_job(self.store, run.tref)
        return self._summary(run)

    def _report(self, run: Run, last: MeasureResult | None = None, message: str = "") -> None:
        best_s = run.best.median_s if run.best is not None else None
        self.on_progress(Progress(run.job_id, run.done, run.req.trials, best_s,
                                  gflops(run.req.workload.flops, best_s), last, message))

    @staticmethod
    def _input(req: TuneRequest, run: Run, cand: tv.ms.MeasureCandidate, cand_hash: str,
               x: np.ndarray, predicted_s: float | None = None) -> MeasureInput:
        trace_json = tv.trace_to_json(cast(tv.Trace, cand.sch.trace))  # traced schedules
        job_id = run.job_id
        context = {"job_id": job_id, "workload_id": run.wid, "target_id": run.tref.id,
                   "space": req.space, "cand_hash": cand_hash,
                   "decisions": tv.trace_decisions(cast(tv.Trace, cand.sch.trace)),
                   "features_b64": base64.b64encode(x.astype(np.float32).tobytes()).decode(),
                   "tvm_version": tv.tvm_version(), "knobs": run.namer(trace_json)}
        if predicted_s is not None and np.isfinite(predicted_s):
            context["predicted_s"] = float(predicted_s)
        return MeasureInput(trial_id=trial_id(job_id, cand_hash), workload_key=req.workload.key,
                            workload_spec=req.workload.spec, target=req.target,
                            trace_json=trace_json, options=req.options,
                            context=context)

    def _measure(self, inp: MeasureInput) -> MeasureResult:
        """Measure one candidate and write its record, unless the measurement path commits it
        itself (`Measurer.commits_records`: the farm's API does). An infrastructure failure is
        recorded here under its own attempt id (the trial id stays free for the real result;
        nobody else writes that record) and retried once; too many in a row fail the job
        instead of spinning."""
        tid = inp.trial_id
        for _attempt in range(2):
            res = self.measurer.measure_one(inp)
            if res.invalidity != Invalidity.WORKER_LOST:
                self._lost_in_a_row = 0
                if not self.measurer.commits_records:
                    self.store.add_records([NewRecord.from_measurement(inp, res)])
                return res
            lost_id = f"{tid[:20]}-lost-{uuid.uuid4().hex[:8]}"
            self.store.add_records([NewRecord.from_measurement(
                replace(inp, trial_id=lost_id), replace(res, trial_id=lost_id))])
            self._lost_in_a_row += 1
            if self._lost_in_a_row >= MAX_LOST_IN_A_ROW:
                raise TunefarmError(f"{self._lost_in_a_row} measurements in a row failed outside "
                                    f"the kernel (worker_lost); last: {res.error_msg}")
        return res

    def _summary(self, run: Run) -> TuneSummary:
        best = next(iter(self.store.best(run.wid, run.tref.id, k=1)), None)
        counts = Counter(str(r.invalidity) for r in self.store.records(job_id=run.job_id))
        return TuneSummary(
            job_id=run.job_id, workload_key=run.req.workload.key, target_key=run.tref.key,
            trials_done=run.done, measured_now=run.measured_now, skipped_duplicates=run.dups,
            reproposed=run.reproposed,
            stop_reason=run.stop, wall_s=time.monotonic() - run.t0,
            best_trial=best.trial_id if best else None,
            best_s=best.median_s if best else None,
            best_gflops=gflops(run.req.workload.flops, best.median_s) if best else None,
            counts=dict(counts))
