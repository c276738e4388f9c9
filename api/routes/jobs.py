"""/v1/jobs: submit, read, list, cancel, a job's records, and its live events (SSE)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tuner.db import jobs as jobs_db
from tuner.db.models import JobState

from .. import jobs
from ..deps import CtxDep, UserDep
from ..events import SSE_HEADERS, event_stream, parse_last_event_id
from ..schemas import JobCreate, JobPage, JobPublic, Problem, RecordPage
from . import V1

router = APIRouter(prefix=f"{V1}/jobs", tags=["jobs"])

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem},
    422: {"model": Problem},
}
JOB_LOCATION = "/v1/jobs/{}"


@router.post("", status_code=202, response_model=JobPublic, responses={
    **_PROBLEMS, 400: {"model": Problem, "description": "malformed JSON"}})
def submit_job(body: JobCreate, response: Response, ctx: CtxDep, _: UserDep,
               idempotency_key: Annotated[str | None, Header(max_length=200)] = None
               ) -> dict[str, Any]:
    """Validate and queue a tuning job. With an `Idempotency-Key`, repeating the same request
    returns the same job; reusing the key for a different request is a 422
    `idempotency_conflict`."""
    done = jobs.submit(ctx, body, idempotency_key)
    response.headers["Location"] = JOB_LOCATION.format(done.job.id)
    response.headers["Retry-After"] = "2"
    return jobs_db.job_dict(ctx.store, done.job)


@router.get("", response_model=JobPage, responses=_PROBLEMS)
def list_jobs(ctx: CtxDep, _: UserDep, state: JobState | None = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(max_length=500)] = None) -> dict[str, Any]:
    """Jobs, newest first, one page at a time (pass `next_cursor` back as `cursor`)."""
    rows, nxt = jobs_db.list_jobs(ctx.store, state=state, limit=limit, cursor=cursor)
    return {"items": [jobs_db.job_dict(ctx.store, r) for r in rows], "next_cursor": nxt}


@router.get("/{job_id}", response_model=JobPublic, responses=_PROBLEMS)
def get_job(job_id: str, ctx: CtxDep, _: UserDep) -> dict[str, Any]:
    return jobs_db.job_dict(ctx.store, jobs.get(ctx, job_id))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic, responses=_PROBLEMS)
def cancel_job(job_id: str, ctx: CtxDep, _: UserDep) -> dict[str, Any]:
    """Cancel (idempotent): a queued job is cancelled at once, a running one stops after its
    current candidate (CANCELLING, then CANCELLED); finished jobs are left as they are."""
    return jobs_db.job_dict(ctx.store, jobs.cancel(ctx, job_id))


@router.get("/{job_id}/records", response_model=RecordPage, responses=_PROBLEMS)
def job_records(job_id: str, ctx: CtxDep, _: UserDep,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                cursor: Annotated[str | None, Query(max_length=200)] = None) -> dict[str, Any]:
    """A job's measured records in the order they were stored."""
    items, nxt = jobs.records_page(ctx, job_id, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": nxt}


@router.get("/{job_id}/events", response_class=StreamingResponse, responses={
    **_PROBLEMS, 200: {"content": {"text/event-stream": {}},
                       "description": "Server-sent events: state, progress, record"}})
async def job_events(job_id: str, ctx: CtxDep, _: UserDep,
                     last_event_id: Annotated[str | None, Header()] = None,
                     after: Annotated[str | None, Query(
                         description="Like Last-Event-ID, for clients that cannot set it")] = None
                     ) -> StreamingResponse:
    """The job's events as `text/event-stream`, replayed after `Last-Event-ID` (else from the
    start); the stream ends after a "state" event with a terminal state."""
    start = parse_last_event_id(last_event_id or after)
    await run_in_threadpool(jobs.get, ctx, job_id)  # 404 before the stream starts
    return StreamingResponse(event_stream(ctx, job_id, start), media_type="text/event-stream",
                             headers=SSE_HEADERS)
