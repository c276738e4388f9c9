"""What the job routes do, apart from HTTP: submit (validate, create through
`tuner.db.jobs.create_job`, enqueue), cancel, and pages of a job's records. Runs in the thread
pool (SQL, TVM, the synchronous Redis client); the SQL itself lives in `tuner.db`.

Ownership: a job belongs to the principal that submitted it (`Principal.owner`). `get` (and so
read, records, events, cancel) answers another owner's job exactly like a job that does not
exist (404 `not_found`: no one learns that it exists); admin tokens see every job."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import BaseModel

from tuner.core.errors import NotFound, TargetError
from tuner.db import jobs as jobs_db
from tuner.db import workers as workers_db
from tuner.db.jobs import JobOptions, NewJob
from tuner.db.rows import JobRow
from tuner.db.tables import JobState, utcnow
from tuner.db.tokens import Principal, Scope
from tuner.queue import events, mark_cancelled
from tuner.queue.streams import enqueue

from .context import ApiContext
from .errors import ApiProblem
from .schemas import JobCreate, RecordPublic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    job: JobRow
    created: bool  # False: an earlier request with the same Idempotency-Key made it


def request_hash(body: BaseModel) -> str:
    canon = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def submit(ctx: ApiContext, body: JobCreate, idempotency_key: str | None,
           principal: Principal) -> Submitted:
    """Validate everything, then create the job (QUEUED, owned by `principal`, within its
    quotas) and tell the tuners. The Idempotency-Key is the owner's: another owner's use of the
    same key is unrelated."""
    rhash = request_hash(body)
    # quotas before any work (a TVMScript parse child costs seconds); a replay of a keyed
    # request is answered with its job below
    jobs_db.Quotas.from_settings(ctx.settings).precheck_new(
        ctx.store, principal.owner, body.trials, idempotency_key)
    tgt = ctx.resolver.target(body.target)
    check_cores(ctx, tgt.as_dict, body.device_key)
    wl = ctx.resolver.workload(body.workload, who=principal.owner)
    task = ctx.resolver.task(wl, tgt, body.device_key, body.space)
    options = JobOptions.from_settings(ctx.settings, batch_size=body.batch_size, seed=body.seed,
                                       early_stop=body.early_stop)
    started = utcnow()
    job = jobs_db.create_job(ctx.store, NewJob(
        workload_id=task.workload_id, workload_key=wl.key, target=task.target_ref,
        space=task.space, trials=body.trials, options=options,
        wall_budget_s=body.wall_budget_s, state=JobState.QUEUED,
        idempotency_key=idempotency_key, request_hash=rhash, owner=principal.owner),
        settings=ctx.settings)
    if idempotency_key is not None and job.request_hash != rhash:
        raise ApiProblem("idempotency_conflict",
                         f"Idempotency-Key {idempotency_key!r} was already used for a different "
                         f"request (job {job.id}); use a new key for a new job", job_id=job.id)
    created = job.created_at >= started
    if created:
        try:
            enqueue(ctx.sync_redis, ctx.keys.jobs, {"job_id": job.id})
        except (redis.RedisError, OSError) as exc:  # SQL has it: tuners also claim from SQL
            log.warning("job %s stored but not enqueued (Redis: %s)", job.id, exc)
        events.publish(ctx.sync_redis, ctx.keys, job.id, "state", {"state": str(job.state)})
        log.info("job %s submitted: %s on %s, %d trials", job.id, wl.key, task.target_ref.key,
                 body.trials)
    return Submitted(job, created)


def check_cores(ctx: ApiContext, target: dict[str, Any], device_key: str) -> None:
    """A target's `num-cores` may not pass the cores of the device key's workers (when any
    has registered): a kernel parallelised for more cores than its board has is no job."""
    cores = target.get("num-cores")
    most = workers_db.max_cores(ctx.store, device_key) if isinstance(cores, int) else None
    if most is not None and isinstance(cores, int) and cores > most:
        raise TargetError(f"must be from 1 to {most}: the workers of device key {device_key!r} "
                          f"have at most {most} cores, not {cores}", field="target.num-cores")


def may_see(principal: Principal, job: JobRow) -> bool:
    """Whether `principal` may read, follow and cancel `job`: its owner, or an admin."""
    return principal.scope is Scope.ADMIN or job.owner == principal.owner


def list_owner(principal: Principal, wanted: str | None = None) -> str | None:
    """Whose jobs `principal` lists: its own (None: everyone's, for an admin), narrowed to
    `wanted` by an admin. Check `may_list` first: another owner's `wanted` lists nothing."""
    return wanted if principal.scope is Scope.ADMIN else principal.owner


def may_list(principal: Principal, wanted: str | None) -> bool:
    """False when a non-admin asks for another owner's jobs (an empty page, not an error)."""
    return principal.scope is Scope.ADMIN or wanted in (None, principal.owner)


def get(ctx: ApiContext, job_id: str, principal: Principal) -> JobRow:
    """The job, if `principal` may see it; another owner's job is a 404 like a missing one."""
    job = ctx.store.get_job(job_id)
    if job is None or not may_see(principal, job):
        raise NotFound(f"no job {job_id!r}")
    return job


def cancel(ctx: ApiContext, job_id: str, principal: Principal) -> JobRow:
    """Idempotent: QUEUED -> CANCELLED, RUNNING -> CANCELLING, others unchanged."""
    before = get(ctx, job_id, principal)
    job = jobs_db.request_cancel(ctx.store, job_id)
    if job.state in (JobState.CANCELLED, JobState.CANCELLING):
        mark_cancelled(ctx.sync_redis, ctx.keys, job_id)
    if job.state is not before.state:
        events.publish(ctx.sync_redis, ctx.keys, job_id, "state", {"state": str(job.state)})
        log.info("job %s: %s -> %s (cancel requested)", job_id, before.state, job.state)
    return job


def records_page(ctx: ApiContext, job_id: str, principal: Principal, *, limit: int,
                 cursor: str | None) -> tuple[list[RecordPublic], str | None]:
    """A job's records in the order they were stored, `limit` at a time (keyset pagination)."""
    return jobs_db.records_page(ctx.store, get(ctx, job_id, principal), limit=limit,
                                cursor=cursor)
