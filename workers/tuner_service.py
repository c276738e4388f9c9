"""`tunefarm tuner`: the service's search-loop process.

Jobs are claimed in SQL (`tuner.db.jobs.claim`, a lease judged by the database clock); the Redis
stream Keys.jobs only wakes tuners up. Every poll also claims from SQL directly, so a Redis wipe
or a dead tuner loses nothing: a job whose tuner stopped renewing its lease is resumed by another
tuner from its committed records. Several tuner processes may run side by side, one job each.

While a job runs, a lease thread renews the lease every few seconds and watches the job's state:
a cancel request (CANCELLING) cancels the job at once, abandoning the measurements in flight.
SIGTERM (or `stop_event`) stops the tuner promptly: the running job goes back to RUNNING with
its lease released, for another tuner to resume.

Model jobs: their rounds are ordinary task jobs. The tuner that ends one advances its model job
(`tuner.db.model_jobs.advance`: the next round, QUEUED for any tuner, or the model's end), and
every poll advances the model jobs left without a round in flight (`stalled`), so a tuner that
died between the two steps loses nothing.

Fairness: `tuner.db.jobs.claim` picks the job of the owner with the fewest jobs held by tuners.
Wall budget: a job's `wall_budget_s` counts from its `started_at` (when it first became RUNNING,
not when it was submitted; a resumed job keeps its first start). It is enforced between
candidates (`should_stop`), while waiting for a measurement (the wait is abandoned at the
deadline) and by the worker: each input's run deadline (`MeasureOptions.run_timeout_s`) is capped
to the time left, at least `MIN_RUN_TIMEOUT_S` (`_Deadlined`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar

import redis

from tuner.core import logs, signals
from tuner.core.config import Settings, get_settings
from tuner.core.errors import Conflict
from tuner.core.isolation import undumpable
from tuner.core.liveness import Renewer
from tuner.db import Store, model_jobs
from tuner.db import jobs as jobdb
from tuner.db.jobs import JobOptions
from tuner.db.rows import JobRow
from tuner.db.tables import JobState, utcnow
from tuner.measure import MeasureInput, MeasureOptions, Measurer, MeasureResult
from tuner.measure.remote import Interrupted, RemoteMeasurer
from tuner.measure.watch import WorkerWatch
from tuner.model.rounds import gradient_plan
from tuner.queue import Keys, events, mark_cancelled, streams
from tuner.search import Progress, Tuner, TuneRequest
from tuner.search.task import CanonicalTarget, ResolvedTask, TaskResolver
from tuner.workloads import parse_spec
from workers import service_metrics as metrics

log = logging.getLogger(__name__)

MIN_RUN_TIMEOUT_S = 1.0  # a run deadline capped by a job's wall budget is never shorter
BUDGET_REACHED = "wall-clock budget reached"


def tune_request(store: Store, job: JobRow, settings: Settings) -> TuneRequest:
    """The TuneRequest of a stored job (its resolved task, trials, options); the
    measurement protocol is the settings' (`MeasureOptions.from_settings`), as in `tunefarm
    tune`."""
    wrow = store.get_workload(job.workload_id)
    tref = store.get_target(job.target_id)
    if wrow is None or tref is None:
        raise LookupError(f"job {job.id} names a workload or target that does not exist")
    target = CanonicalTarget.of(json.loads(tref.target_json))
    workload = parse_spec(json.loads(wrow.spec_json))
    opts = JobOptions.from_stored(job.options or {}, settings)
    # the job's rows are its task (registered where it was submitted); its space is checked
    # against this process's templates, as the loop would (a resolved name stays itself)
    space = TaskResolver(store).space(job.space, workload, target)
    task = ResolvedTask(workload, job.workload_id, target, tref, space)
    return TuneRequest(
        workload=workload, target=target.as_dict, trials=job.trials,
        device_key=tref.device_key, space=space, batch_size=opts.batch_size,
        early_stop=opts.early_stop, seed=opts.seed,
        options=MeasureOptions.from_settings(settings, target.as_dict), job_id=job.id, task=task)


@dataclass
class _JobWatch:
    """What the lease thread learns about the running job."""

    job: JobRow
    entry_id: str | None = None  # its wake-up entry on Keys.jobs, held while the job runs
    started_at: datetime | None = None  # the job's started_at, once it runs (for its budget)
    cancelled: bool = False
    lease_lost: bool = False
    abort: threading.Event = field(default_factory=threading.Event)  # stop measuring now
    done: threading.Event = field(default_factory=threading.Event)


class TunerService:
    """One tuner process: claims jobs and runs them one at a time."""

    def __init__(self, store: Store, r: redis.Redis, keys: Keys, *, settings: Settings,
                 stop_event: threading.Event, poll_s: float = 2.0, owner: str | None = None,
                 renew_every_s: float | None = None) -> None:
        self.store, self.r, self.keys, self.settings = store, r, keys, settings
        self.stop_event = stop_event
        self.poll_s = poll_s
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_s = settings.job_lease_s
        self.renew_every_s = renew_every_s or max(0.2, min(5.0, self.lease_s / 3))
        self.jobs_run = 0

    # ------------------------------------------------------------------ claiming
    def step(self) -> bool:
        """One poll: run a job if one can be claimed; False when there was nothing to do."""
        self._advance_stalled_models()
        job = self._claim()
        entry_id = None
        if job is None:
            job, entry_id = self._claim_from_stream()
        if job is None:
            return False
        self.run_job(job, entry_id)
        return True

    def _claim(self, job_id: str | None = None) -> JobRow | None:
        return jobdb.claim(self.store, self.owner, self.lease_s, job_id=job_id)

    def _claim_from_stream(self) -> tuple[JobRow | None, str | None]:
        """Wait up to poll_s for a wake-up on Keys.jobs (new entries, or a dead tuner's entries
        past the lease); entries for jobs this tuner cannot claim are acknowledged at once."""
        stream, group = self.keys.jobs, Keys.TUNERS_GROUP
        try:
            entries = streams.reclaim(self.r, stream, group, self.owner, min_idle_s=self.lease_s,
                                      count=10)
            metrics.JOB_RECLAIMS.inc(len(entries))
            entries += streams.read_new(self.r, stream, group, self.owner, count=1,
                                        block_s=None if entries else self.poll_s)
        except (redis.RedisError, OSError) as exc:
            log.warning("job stream unavailable (%s); polling SQL only", exc)
            self.stop_event.wait(self.poll_s)
            return None, None
        job: JobRow | None = None
        entry_id = None
        for entry in entries:
            if job is None:
                job = self._claim(entry.fields.get("job_id", ""))
                if job is not None:
                    entry_id = entry.id
                    continue
            self._ack(entry.id)
        return job, entry_id

    def _ack(self, entry_id: str | None) -> None:
        if entry_id is None:
            return
        try:
            streams.ack(self.r, self.keys.jobs, Keys.TUNERS_GROUP, entry_id)
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot acknowledge job entry %s: %s", entry_id, exc)

    # ------------------------------------------------------------------ running
    def run_job(self, job: JobRow, entry_id: str | None = None) -> JobRow | None:
        """Run a claimed job to a terminal state (or until this tuner stops); returns its row."""
        with logs.bound(job_id=job.id), metrics.JOBS_RUNNING.track_inprogress():
            return metrics.job_ended(self._run_job(job, entry_id))

    def _run_job(self, job: JobRow, entry_id: str | None) -> JobRow | None:
        log.info("tuner %s runs job %s (%s)", self.owner, job.id, job.state)
        watch = _JobWatch(job, entry_id)
        renewer = Renewer(f"lease-{job.id[:8]}", self.renew_every_s,
                          lambda: self._renew_lease(watch), what=f"the lease of job {job.id}",
                          tick=lambda: self._watch_stop(watch), done=watch.done).start()
        measurer = None
        try:
            req = tune_request(self.store, job, self.settings)
            serving = WorkerWatch(
                self.store, req.device_key, lambda why: self.store.set_job_message(job.id, why),
                give_up_s=self.settings.no_worker_timeout_s,
                stale_after_s=3 * self.settings.heartbeat_s)
            measurer = RemoteMeasurer(
                self.r, self.keys, req.device_key, store=self.store,
                queue_wait_s=self.settings.queue_wait_s, lease_s=self.settings.lease_s,
                trial_ttl_s=self.settings.trial_ttl_s,
                interrupt=lambda: self._budget_spent(watch), shutdown=watch.abort, watch=serving,
                confirm=self.settings.confirm_best, counters=metrics)
            tuner = Tuner(self.store, _Deadlined(measurer, lambda: self._time_left(watch)),
                          on_progress=self._progress, should_stop=lambda: self._should_stop(watch))
            self._publish_state(job.id, JobState.RUNNING)
            tuner.run(req)
        except Interrupted as exc:  # the loop leaves the job RUNNING: another tuner resumes it
            log.info("job %s interrupted: %s", job.id, exc)
        except Conflict as exc:  # the loop could not fail a job cancelled under it: fine
            log.info("job %s stopped: %s", job.id, exc)
        except Exception as exc:
            log.exception("job %s failed", job.id)
            self._fail(job.id, f"{type(exc).__name__}: {exc}")
        finally:
            renewer.stop()
            if measurer is not None:
                measurer.discard()
                with contextlib.suppress(Exception):  # the job's "waiting" message, cleared
                    serving.close()
        return self._finish(watch, entry_id)

    def _finish(self, watch: _JobWatch, entry_id: str | None) -> JobRow | None:
        job_id = watch.job.id
        row = self.store.get_job(job_id)
        if row is not None and not row.state.is_terminal and watch.cancelled:
            row = self._transition(job_id, JobState.CANCELLED)
        if row is not None and row.state.is_terminal:
            self._ack(entry_id)
            self.jobs_run += 1
            self._publish_state(job_id, row.state, row.error)
            if row.model_id is not None:
                self._advance_model(row.model_id)
        elif row is not None and not watch.lease_lost:
            jobdb.release(self.store, job_id, self.owner)  # another tuner resumes it
        return row

    # ------------------------------------------------------------------ model jobs
    def _advance_model(self, model_id: str) -> None:
        """A task job of a model job ended: start the model's next round (a QUEUED task job,
        which any tuner may claim) or end the model job."""
        try:
            step = model_jobs.advance(self.store, model_id, gradient_plan)
        except Exception:  # the next poll's sweep tries again
            log.exception("cannot advance model job %s", model_id)
            return
        if step.started and step.job_id is not None:
            log.info("model job %s: next round is job %s", model_id, step.job_id)
            with contextlib.suppress(redis.RedisError, OSError):
                streams.enqueue(self.r, self.keys.jobs, {"job_id": step.job_id})

    def _advance_stalled_models(self) -> None:
        """Model jobs whose last round ended without a next one (its tuner died in between)."""
        try:
            stalled = model_jobs.stalled(self.store)
        except Exception as exc:
            log.warning("cannot list model jobs: %s", exc)
            return
        for model_id in stalled:
            self._advance_model(model_id)

    def _transition(self, job_id: str, to: JobState, **kw: Any) -> JobRow | None:
        try:
            return self.store.set_job_state(job_id, to, **kw)
        except Conflict as exc:
            log.info("job %s: %s", job_id, exc)
            return self.store.get_job(job_id)

    def _fail(self, job_id: str, error: str) -> None:
        row = self.store.get_job(job_id)
        if row is not None and not row.state.is_terminal:
            self._transition(job_id, JobState.FAILED, error=error[:2000])

    def _should_stop(self, watch: _JobWatch) -> str | None:
        if watch.cancelled:
            return "cancelled"
        if self._budget_spent(watch):
            return BUDGET_REACHED
        if watch.abort.is_set():
            raise Interrupted("tuner stopping")
        return None

    def _time_left(self, watch: _JobWatch) -> float | None:
        """Seconds left of the job's wall budget, counted from its started_at (read from SQL
        once, after the search loop made it RUNNING); None without a budget or before then."""
        budget = watch.job.wall_budget_s
        if budget is None:
            return None
        if watch.started_at is None:
            began = watch.job.started_at
            if began is None:
                row = self.store.get_job(watch.job.id)
                began = row.started_at if row is not None else None
            if began is None:
                return None
            watch.started_at = began
        return budget - (utcnow() - watch.started_at).total_seconds()

    def _budget_spent(self, watch: _JobWatch) -> str | None:
        left = self._time_left(watch)
        return BUDGET_REACHED if left is not None and left <= 0 else None

    def _progress(self, p: Progress) -> None:
        last = None if p.last is None else str(p.last.invalidity)
        events.publish(self.r, self.keys, p.job_id, "progress",
                       {"done": p.done, "total": p.total, "best_s": p.best_s,
                        "best_gflops": p.best_gflops, "last": last, "message": p.message})

    def _publish_state(self, job_id: str, state: JobState, error: str | None = None) -> None:
        data: dict[str, Any] = {"state": str(state)}
        if error:
            data["error"] = error
        events.publish(self.r, self.keys, job_id, "state", data)

    # ------------------------------------------------------------------ lease
    def _watch_stop(self, watch: _JobWatch) -> None:
        """Between renewals (every 0.1 s): a stopping tuner aborts the job's measurements."""
        if self.stop_event.is_set():
            watch.abort.set()

    def _renew_lease(self, watch: _JobWatch) -> bool:
        """Renew the job's lease (every renew_every_s), then look for a cancel request; False
        when the lease is lost (the job is aborted here, another tuner holds it)."""
        if not jobdb.renew(self.store, watch.job.id, self.owner, self.lease_s):
            log.error("tuner %s lost the lease of job %s: stopping it here", self.owner,
                      watch.job.id)
            watch.lease_lost = True
            watch.abort.set()
            return False
        row = self.store.get_job(watch.job.id)
        if row is not None and row.state is JobState.CANCELLING and not watch.cancelled:
            self._cancel(watch)
        self._keep_entry(watch)
        return True

    def _keep_entry(self, watch: _JobWatch) -> None:
        """Keep the job's wake-up entry from being reclaimed by other tuners while it runs."""
        if watch.entry_id is None:
            return
        with contextlib.suppress(redis.RedisError, OSError):
            streams.keep_lease(self.r, self.keys.jobs, Keys.TUNERS_GROUP, self.owner,
                               [watch.entry_id])

    def _cancel(self, watch: _JobWatch) -> None:
        """A cancel request: the job is CANCELLED now, workers skip its queued trials and the
        measurement in flight is abandoned."""
        job_id = watch.job.id
        log.info("job %s: cancel requested", job_id)
        mark_cancelled(self.r, self.keys, job_id)
        watch.cancelled = True
        self._transition(job_id, JobState.CANCELLED)
        watch.abort.set()


class _Deadlined(Measurer):
    """The farm measurer of one job, giving each input a run deadline no later than the job's
    wall-clock deadline: `run_timeout_s` capped to the time left (at least MIN_RUN_TIMEOUT_S),
    so the worker itself stops a kernel at the job's deadline. Build deadlines are left alone
    (a build cut short would be recorded as a `build_timeout` of a good candidate)."""

    commits_records: ClassVar[bool] = RemoteMeasurer.commits_records

    def __init__(self, inner: RemoteMeasurer, time_left: Callable[[], float | None]) -> None:
        self.inner = inner
        self.time_left = time_left

    def capped(self, inp: MeasureInput) -> MeasureInput:
        left = self.time_left()
        if left is None:
            return inp
        cap = max(MIN_RUN_TIMEOUT_S, left)
        if inp.options.run_timeout_s <= cap:
            return inp
        return replace(inp, options=replace(inp.options, run_timeout_s=cap))

    def prepare(self, inputs: list[MeasureInput]) -> None:
        self.inner.prepare([self.capped(i) for i in inputs])

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        return self.inner.measure_one(self.capped(inp))

    def probe(self) -> bool:
        return self.inner.probe()

    def close(self) -> None:
        self.inner.close()


def run_tuner(*, store_url: str | None, redis_url: str, prefix: str,
              stop_event: threading.Event | None = None, poll_s: float = 2.0, once: bool = False,
              settings: Settings | None = None) -> int:
    """The `tunefarm tuner` loop: claim jobs (SQL lease; Keys.jobs wakes us up) and run them
    until SIGTERM/SIGINT or `stop_event`. `once`: return after one job, or after one poll that
    found nothing to do. Returns how many jobs reached a terminal state here."""
    settings = settings or get_settings()
    stop = stop_event or threading.Event()
    restore = signals.stop_on_signals(stop)
    undumpable()  # database and Redis credentials: hidden from processes of the same user
    store = Store(store_url)
    r = streams.connect(redis_url)
    svc = TunerService(store, r, Keys(prefix), settings=settings, stop_event=stop, poll_s=poll_s)
    log.info("tuner %s started (store %s, redis prefix %r)", svc.owner, store.safe_url, prefix)
    try:
        try:
            streams.ensure_group(r, svc.keys.jobs, Keys.TUNERS_GROUP)
        except (redis.RedisError, OSError) as exc:
            log.warning("Redis unavailable at start (%s); polling SQL", exc)
        while not stop.is_set():
            try:
                svc.step()
            except Exception:
                log.exception("tuner %s: poll failed; retrying in %.1f s", svc.owner, poll_s)
                stop.wait(poll_s)
            if once:
                break
    finally:
        signals.restore(restore)
        r.close()
        store.close()
        log.info("tuner %s stopped after %d jobs", svc.owner, svc.jobs_run)
    return svc.jobs_run
