"""Jobs as the service sees them: the state machine, cancellation, listing, and the leases that
tell which tuner process runs a job.

A lease is judged by the database clock (PostgreSQL's `now()`; SQLite, one host, uses this
host's): a tuner renews its lease while it works; a job whose lease expired (its tuner died) is
claimed by another tuner, which resumes it from the committed records. Jobs the embedded CLI
runs (`tunefarm tune`) carry the owner `LOCAL_OWNER` and are never claimed by service tuners.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from ..errors import NotFound, SpecError
from ..measure import Invalidity
from . import models as m
from .models import JobState, utcnow
from .rows import JobRow
from .store import Store

LOCAL_OWNER = "local"  # lease_owner of jobs run by the embedded CLI: not for service tuners
ACTIVE = (JobState.QUEUED.value, JobState.RUNNING.value, JobState.CANCELLING.value)


def transition(store: Store, job_id: str, to: JobState | str, *, error: str | None = None,
               reopen: bool = False) -> JobRow:
    """Move a job to state `to` (`Conflict` when the state machine does not allow it)."""
    return store.set_job_state(job_id, to, error=error, reopen=reopen)


def request_cancel(store: Store, job_id: str) -> JobRow:
    """Cancel: a queued job is cancelled at once, a running one becomes CANCELLING (its tuner
    stops after the current candidate); a finished or cancelling job is left as it is."""
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        state, now = JobState(job.state), utcnow()
        if state is JobState.QUEUED:
            job.state, job.finished_at = JobState.CANCELLED.value, now
            job.lease_owner = job.lease_expires_at = None
        elif state is JobState.RUNNING:
            job.state = JobState.CANCELLING.value
        else:
            return JobRow.of(job)
        job.updated_at = now
        s.flush()
        return JobRow.of(job)


def _db_now(s: Session, dialect: str) -> datetime:
    if dialect == "postgresql":
        now = s.scalar(select(func.now()))
        assert now is not None
        return now
    return utcnow()


def claim(store: Store, owner: str, lease_s: float, *, job_id: str | None = None) -> JobRow | None:
    """Take one active job (oldest first) whose lease is free or expired; None if there is none."""
    with store.session() as s:
        now = _db_now(s, store.dialect)
        free = or_(m.Job.lease_owner.is_(None),
                   and_(m.Job.lease_owner != LOCAL_OWNER,
                        or_(m.Job.lease_expires_at.is_(None), m.Job.lease_expires_at < now)))
        q = (select(m.Job).where(m.Job.state.in_(ACTIVE), free)
             .order_by(m.Job.created_at, m.Job.id).limit(1).with_for_update(skip_locked=True))
        if job_id is not None:
            q = q.where(m.Job.id == job_id)
        job = s.scalar(q)
        if job is None:
            return None
        job.lease_owner, job.lease_expires_at = owner, now + timedelta(seconds=lease_s)
        s.flush()
        return JobRow.of(job)


def renew(store: Store, job_id: str, owner: str, lease_s: float) -> bool:
    """Extend `owner`'s lease on the job; False when it no longer holds it."""
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is None or job.lease_owner != owner:
            return False
        job.lease_expires_at = _db_now(s, store.dialect) + timedelta(seconds=lease_s)
        return True


def release(store: Store, job_id: str, owner: str) -> None:
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is not None and job.lease_owner == owner:
            job.lease_owner = job.lease_expires_at = None


def _encode_cursor(job: m.Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, job_id = raw.split("|", 1)
        return datetime.fromisoformat(when), job_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError("not a cursor this service handed out", field="cursor") from exc


def list_jobs(store: Store, *, state: JobState | str | None = None, limit: int = 50,
              cursor: str | None = None) -> tuple[list[JobRow], str | None]:
    """Newest first; returns a page and the cursor of the next page (None: last page)."""
    q = select(m.Job).order_by(m.Job.created_at.desc(), m.Job.id.desc()).limit(limit + 1)
    if state is not None:
        q = q.where(m.Job.state == JobState(state).value)
    if cursor:
        when, job_id = _decode_cursor(cursor)
        q = q.where(or_(m.Job.created_at < when,
                        and_(m.Job.created_at == when, m.Job.id < job_id)))
    with store.session() as s:
        rows = list(s.scalars(q))
        nxt = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
        return [JobRow.of(r) for r in rows[:limit]], nxt


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def job_dict(store: Store, job: JobRow) -> dict[str, Any]:
    """The public JSON of a job: its request, state, progress and best record so far."""
    ok = Invalidity.OK.value
    with store.session() as s:
        w = s.get(m.Workload, job.workload_id)
        t = s.get(m.Target, job.target_id)
        assert w is not None and t is not None
        done = s.scalar(select(func.count()).select_from(m.Record).where(
            m.Record.job_id == job.id, m.Record.invalidity != Invalidity.WORKER_LOST.value)) or 0
        best = s.execute(
            select(m.Record.trial_id, m.Record.median_s)
            .where(m.Record.job_id == job.id, m.Record.invalidity == ok,
                   m.Record.median_s.is_not(None))
            .order_by(m.Record.median_s, m.Record.id).limit(1)).first()
        spec, flops = json.loads(w.spec_json), w.flops
        wkey, target, device = w.key, json.loads(t.target_json), t.device_key
    return {
        "id": job.id, "state": str(job.state), "workload_key": wkey, "workload": spec,
        "target": target, "device_key": device, "space": job.space, "trials": job.trials,
        "trials_done": int(done), "wall_budget_s": job.wall_budget_s, "options": job.options,
        "best": None if best is None else {
            "trial_id": best[0], "latency_s": best[1],
            "gflops": flops / best[1] / 1e9 if flops and best[1] else None},
        "error": job.error, "created_at": _iso(job.created_at), "updated_at": _iso(job.updated_at),
        "started_at": _iso(job.started_at), "finished_at": _iso(job.finished_at),
    }
