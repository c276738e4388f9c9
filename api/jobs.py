"""What the job routes do, apart from HTTP: submit (validate, store, enqueue), cancel, and pages
of a job's records. Runs in the thread pool (SQL, TVM, the synchronous Redis client)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import select

from tuner.db import jobs as jobs_db
from tuner.db import models as m
from tuner.db.models import JobState, utcnow
from tuner.db.rows import JobRow, RecordRow
from tuner.errors import NotFound, SpecError
from tuner.queue import events
from tuner.queue.streams import enqueue
from tuner.records import record_dict
from tuner.search.loop import job_key

from .context import ApiContext
from .errors import ApiProblem
from .schemas import JobCreate

log = logging.getLogger(__name__)
CANCELLED_TTL_S = 24 * 3600


@dataclass(frozen=True)
class Submitted:
    job: JobRow
    created: bool  # False: an earlier request with the same Idempotency-Key made it


def request_hash(body: JobCreate) -> str:
    canon = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _options(ctx: ApiContext, body: JobCreate) -> dict[str, Any]:
    seed = body.seed if body.seed is not None else (ctx.settings.seed or 0)
    opts: dict[str, Any] = {"batch_size": body.batch_size or ctx.settings.batch_size, "seed": seed}
    if body.early_stop is not None:
        opts["early_stop"] = body.early_stop
    return opts


def submit(ctx: ApiContext, body: JobCreate, idempotency_key: str | None) -> Submitted:
    """Validate everything, then create the job (QUEUED) and tell the tuners."""
    rhash = request_hash(body)
    wl = ctx.resolver.workload(body.workload)
    tgt = ctx.resolver.target(body.target)
    space = ctx.resolver.space(body.space, wl, tgt)
    wid = ctx.resolver.workload_id(wl)
    tref = ctx.resolver.target_ref(tgt, body.device_key)
    started = utcnow()
    job = ctx.store.create_job(
        job_key=job_key(wl.key, tref.key, space), workload_id=wid, target_id=tref.id,
        space=space, trials=body.trials, options=_options(ctx, body), state=JobState.QUEUED,
        idempotency_key=idempotency_key, request_hash=rhash, wall_budget_s=body.wall_budget_s)
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
        log.info("job %s submitted: %s on %s, %d trials", job.id, wl.key, tref.key, body.trials)
    return Submitted(job, created)


def get(ctx: ApiContext, job_id: str) -> JobRow:
    job = ctx.store.get_job(job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def cancel(ctx: ApiContext, job_id: str) -> JobRow:
    """Idempotent: QUEUED -> CANCELLED, RUNNING -> CANCELLING, others unchanged."""
    before = get(ctx, job_id)
    job = jobs_db.request_cancel(ctx.store, job_id)
    if job.state in (JobState.CANCELLED, JobState.CANCELLING):
        try:
            ctx.sync_redis.set(ctx.keys.cancelled(job_id), "1", ex=CANCELLED_TTL_S)
        except (redis.RedisError, OSError) as exc:
            log.warning("job %s cancelled in SQL; Redis flag not set: %s", job_id, exc)
    if job.state is not before.state:
        events.publish(ctx.sync_redis, ctx.keys, job_id, "state", {"state": str(job.state)})
        log.info("job %s: %s -> %s (cancel requested)", job_id, before.state, job.state)
    return job


def _encode_cursor(record_id: int) -> str:
    return base64.urlsafe_b64encode(f"r{record_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("r"):
            raise ValueError(raw)
        return int(raw[1:])
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError("not a cursor this service handed out", field="cursor") from exc


def records_page(ctx: ApiContext, job_id: str, *, limit: int,
                 cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A job's records in the order they were stored, `limit` at a time (keyset pagination)."""
    job = get(ctx, job_id)
    after = _decode_cursor(cursor) if cursor else 0
    q = (select(m.Record).where(m.Record.job_id == job_id, m.Record.id > after)
         .order_by(m.Record.id).limit(limit + 1))
    with ctx.store.session() as s:
        rows = [RecordRow.of(r) for r in s.scalars(q)]
        w = s.get(m.Workload, job.workload_id)
        t = s.get(m.Target, job.target_id)
        assert w is not None and t is not None
        wkey, flops, tjson, device = w.key, w.flops, t.target_json, t.device_key
    nxt = _encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    items = [record_dict(r, workload_key=wkey, flops=flops, target_json=tjson, device_key=device)
             for r in rows[:limit]]
    return items, nxt
