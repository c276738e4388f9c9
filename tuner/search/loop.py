"""The search loop: propose a batch (model-guided evolutionary search), drop what was already
measured for this workload and target, measure the rest, commit every result to SQL as it
arrives, retrain the cost model, repeat until the budget or early stopping.

MetaSchedule's `EvolutionarySearch` does the proposing (its mutators, its sampling of the design
space); tunefarm owns everything around it: the budget counts real measurements only, dedup spans
every job that ever ran on this workload and target, the cost model is tunefarm's and starts from
the whole target's history, and a job killed at any point resumes from its committed records.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from schedules.registry import replay, resolve, search_strategy, space_generator
from tuner import tvm_api as tv
from tuner.db.models import JobState
from tuner.db.jobs import LOCAL_OWNER
from tuner.db.store import NewRecord, Store
from tuner.errors import TunefarmError
from tuner.measure import Invalidity, MeasureInput, MeasureOptions, MeasureResult, Measurer
from tuner.search.costmodel import XGBCostModel
from tuner.workloads import Workload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneRequest:
    workload: Workload
    target: dict[str, Any]  # canonical target dict (tuner.tvm_api.target_to_dict)
    trials: int
    device_key: str = "local"
    space: str = "default"  # a template name, "auto", or "default" (best that applies)
    batch_size: int = 16
    early_stop: int | None = None  # stop after this many measured trials without a new best
    seed: int = 0
    fresh: bool = False  # start a new job instead of resuming the last one
    options: MeasureOptions = field(default_factory=MeasureOptions)
    job_id: str | None = None  # service: run exactly this (queued or resumed) job


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
    skipped_duplicates: int
    stop_reason: str
    wall_s: float
    best_trial: str | None
    best_s: float | None
    best_gflops: float | None
    counts: dict[str, int]


def job_key(workload_key: str, target_key: str, space: str) -> str:
    return hashlib.sha256(f"{workload_key}|{target_key}|{space}".encode()).hexdigest()[:32]


def trial_id(job_id: str, cand_hash: str) -> str:
    return hashlib.sha256(f"{job_id}|{cand_hash}".encode()).hexdigest()[:32]


def gflops(flops: int, seconds: float | None) -> float | None:
    return flops / seconds / 1e9 if seconds and flops else None


def sample_space(strategy: Any, args_info: Any, n: int) -> list[Any]:
    """About 1.5 `n` random points of the design space (each design space's trace replayed with
    fresh decisions, then postprocessed), without evolution. `strategy` is a pre-tuned
    EvolutionarySearch; it returns at least its `init_min_unmeasured` points."""
    sample = tv.ms._ffi_api.SearchStrategyEvolutionarySearchSampleInitPopulation
    return [tv.ms.MeasureCandidate(sch, args_info) for sch in sample(strategy, n + n // 2)]


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
    def _register(self, req: TuneRequest) -> tuple[int, Any, Any]:
        wl = req.workload
        wid = self.store.ensure_workload(
            key=wl.key, op=wl.op, spec_json=json.dumps(wl.spec, sort_keys=True), shash=wl.shash(),
            mod_json=tv.save_json(wl.mod()), description=wl.description, flops=int(wl.flops))
        target = tv.make_target(req.target)
        tref = self.store.ensure_target(tv.canonical_target_json(target), req.device_key)
        return wid, tref, target

    def _job(self, req: TuneRequest, wid: int, tref: Any) -> Any:
        if req.job_id is not None:
            job = self.store.get_job(req.job_id)
            if job is None:
                raise TunefarmError(f"no job {req.job_id!r}")
            return job
        key = job_key(req.workload.key, tref.key, req.space)
        job = None if req.fresh else self.store.latest_job(key)
        if job is None:
            return self.store.create_job(job_key=key, workload_id=wid, target_id=tref.id, space=req.space,
                                         trials=req.trials, options={"batch_size": req.batch_size,
                                                                     "seed": req.seed},
                                         lease_owner=LOCAL_OWNER)
        if job.trials != req.trials:
            self.store.update_job_trials(job.id, req.trials)
        return self.store.get_job(job.id)

    def _memory_db(self, wid: int, tref: Any, mod: Any, target: Any) -> Any:
        """Best records of this workload on this target, for the search's initial population."""
        db = tv.ms.database.MemoryDatabase()
        token = db.commit_workload(mod)
        args_info = tv.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        for row in self.store.best(wid, tref.id, k=self.seed_top_k):
            try:
                sch = replay(mod, row.trace_json)
            except Exception:  # noqa: BLE001 - a trace from another TVM version; just skip it
                continue
            db.commit_tuning_record(tv.ms.database.TuningRecord(
                trace=sch.trace, workload=token, run_secs=[row.median_s], target=target,
                args_info=args_info))
        return db

    def _cost_model(self, req: TuneRequest, tref: Any) -> XGBCostModel:
        model = XGBCostModel(seed=req.seed)
        for wid, feats, median_s, inv in self.store.training_rows(tref.id):
            x = np.frombuffer(feats, dtype=np.float32)
            if x.size == model.features_dim:
                model.add(x[None, :], [median_s if inv == Invalidity.OK else None], group=wid)
        model.fit()
        return model

    # ------------------------------------------------------------------ run
    def run(self, req: TuneRequest) -> TuneSummary:
        t0 = time.monotonic()
        wid, tref, target = self._register(req)
        # a bad space fails here, before any job exists; the job is keyed by the resolved space
        req = replace(req, space=resolve(req.space, req.workload, target))
        space = space_generator(req.space, req.workload, target)
        job = self._job(req, wid, tref)
        done = sum(1 for r in self.store.records(job_id=job.id)
                   if r.invalidity != Invalidity.WORKER_LOST)
        best = (self.store.best(wid, tref.id, k=1) or [None])[0]
        flops = req.workload.flops

        def report(last: MeasureResult | None = None, message: str = "") -> None:
            best_s = best.median_s if best is not None else None
            self.on_progress(Progress(job.id, done, req.trials, best_s, gflops(flops, best_s), last,
                                      message))

        reopen = req.job_id is None  # the CLI resumes and extends finished jobs
        if job.state is JobState.CANCELLING:
            self.store.set_job_state(job.id, JobState.CANCELLED)
            report(message="cancelled")
            return self._summary(job.id, req, tref, done, 0, 0, "cancelled", t0, wid)
        if done >= req.trials:
            if job.state is JobState.QUEUED:
                self.store.set_job_state(job.id, JobState.RUNNING)
            self.store.set_job_state(job.id, JobState.SUCCEEDED, reopen=reopen)
            report(message="budget already spent: nothing to measure")
            return self._summary(job.id, req, tref, done, 0, 0, "budget already spent", t0, wid)

        self.store.set_job_state(job.id, JobState.RUNNING, reopen=reopen)
        final = JobState.SUCCEEDED
        report(message="resuming" if done else "starting")
        measured_now = dups = 0
        stop = "budget reached"
        try:
            mod = req.workload.mod()
            ctx = tv.tune_context(mod, target, space=space,
                                  strategy=search_strategy(req.space),
                                  seed=req.seed, num_threads=max(1, req.options.num_threads))
            model = self._cost_model(req, tref)
            strategy = ctx.search_strategy
            memdb = self._memory_db(wid, tref, mod, target)
            args_info = tv.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
            token = memdb.commit_workload(mod)
            # measured programs this search did not propose (sampled, or from earlier jobs) join
            # its population from `memdb` and can fill that many of its picks: ask for more
            overlap = int(strategy.population_size * strategy.init_measured_ratio)
            strategy.pre_tuning(max_trials=1 << 30, num_trials_per_iter=req.batch_size + overlap,
                                design_spaces=ctx.generate_design_space(), database=memdb,
                                cost_model=model)
            measured = self.store.measured(wid, tref.id)
            best_at = done
            dup_batches = 0
            while done < req.trials:
                # an untrained model scores at random: evolving a population by its scores only
                # costs replays, so the first batch samples the space directly
                cands = (strategy.generate_measure_candidates() if model.trained
                         else sample_space(strategy, args_info, req.batch_size))
                if not cands:
                    stop = "search space exhausted"
                    break
                hashes = [f"{tv.structural_hash(c.sch.mod):016x}" for c in cands]
                fresh = []
                for c, h in zip(cands, hashes, strict=True):
                    if h not in measured and h not in {fh for _, fh in fresh}:
                        fresh.append((c, h))
                dups += len(cands) - len(fresh)
                fresh = fresh[: min(req.batch_size, req.trials - done)]
                dup_batches = 0 if fresh else dup_batches + 1
                if dup_batches >= self.max_dup_batches:
                    stop = "search keeps proposing measured candidates"
                    break
                feats = model.features(ctx, [c for c, _ in fresh])
                inputs = [self._input(req, job.id, c, h, x, wid, tref.id)
                          for (c, h), x in zip(fresh, feats, strict=True)]
                if hasattr(self.measurer, "prepare"):  # e.g. build the batch in parallel
                    self.measurer.prepare(inputs)
                trained, lats, notified = [], [], []
                halt: str | None = None
                for (c, h), x, inp in zip(fresh, feats, inputs, strict=True):
                    opts = replace(req.options, verify_below_s=best.median_s if best else None)
                    res = self._measure(replace(inp, options=opts))
                    if res.invalidity == Invalidity.WORKER_LOST:
                        halt = self.should_stop()  # not measured: may come back, never trains
                        if halt:
                            break
                        continue
                    measured[h] = res
                    done += 1
                    measured_now += 1
                    trained.append(x)
                    lats.append(res.median_s if res.ok else None)
                    notified.append(c)
                    if res.ok:
                        memdb.commit_tuning_record(tv.ms.database.TuningRecord(
                            trace=c.sch.trace, workload=token, run_secs=[res.median_s],
                            target=target, args_info=args_info))
                        if best is None or res.median_s < best.median_s:
                            best = _Best(res.trial_id, res.median_s)
                            best_at = done
                    report(res)
                    halt = self.should_stop()
                    if halt or (req.early_stop and done - best_at >= req.early_stop):
                        break
                if trained:
                    model.add(np.stack(trained), lats, group=wid)
                    model.fit()
                strategy.notify_runner_results(
                    notified,
                    [tv.ms.runner.RunnerResult(run_secs=[lat or 1e10], error_msg=None) for lat in lats])
                if halt:
                    stop = halt
                    final = JobState.CANCELLED if halt == "cancelled" else JobState.SUCCEEDED
                    break
                if req.early_stop and done - best_at >= req.early_stop:
                    stop = f"early stop: no new best in {req.early_stop} trials"
                    break
            strategy.post_tuning()
        except BaseException as exc:
            if getattr(exc, "leave_job_state", False):
                raise  # e.g. a service tuner stopping or losing its lease: another resumes the job
            state_msg = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
            self.store.set_job_state(job.id, JobState.FAILED, error=state_msg[:2000])
            raise
        self.store.set_job_state(job.id, final)
        report(message=stop)
        return self._summary(job.id, req, tref, done, measured_now, dups, stop, t0, wid)

    @staticmethod
    def _input(req: TuneRequest, job_id: str, cand: Any, cand_hash: str, x: np.ndarray, wid: int,
               target_id: int) -> MeasureInput:
        context = {"job_id": job_id, "workload_id": wid, "target_id": target_id,
                   "space": req.space, "cand_hash": cand_hash,
                   "decisions": tv.trace_decisions(cand.sch.trace),
                   "features_b64": base64.b64encode(x.astype(np.float32).tobytes()).decode(),
                   "tvm_version": tv.tvm_version()}
        return MeasureInput(trial_id=trial_id(job_id, cand_hash), workload_key=req.workload.key,
                            workload_spec=req.workload.spec, target=req.target,
                            trace_json=tv.trace_to_json(cand.sch.trace), options=req.options,
                            context=context)

    def _measure(self, inp: MeasureInput) -> MeasureResult:
        """Measure and commit one candidate. An infrastructure failure is recorded under its own
        attempt id (the trial id stays free for the real result) and retried once; too many in a
        row fail the job instead of spinning."""
        tid = inp.trial_id
        for _attempt in range(2):
            res = self.measurer.measure_one(inp)
            if res.invalidity != Invalidity.WORKER_LOST:
                self._lost_in_a_row = 0
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

    def _summary(self, job_id: str, req: TuneRequest, tref: Any, done: int, measured_now: int,
                 dups: int, stop: str, t0: float, wid: int) -> TuneSummary:
        best = (self.store.best(wid, tref.id, k=1) or [None])[0]
        counts = Counter(str(r.invalidity) for r in self.store.records(job_id=job_id))
        return TuneSummary(
            job_id=job_id, workload_key=req.workload.key, target_key=tref.key, trials_done=done,
            measured_now=measured_now, skipped_duplicates=dups, stop_reason=stop,
            wall_s=time.monotonic() - t0, best_trial=best.trial_id if best else None,
            best_s=best.median_s if best else None,
            best_gflops=gflops(req.workload.flops, best.median_s) if best else None,
            counts=dict(counts))


@dataclass
class _Best:
    trial_id: str
    median_s: float
