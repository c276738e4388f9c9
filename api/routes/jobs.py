"""/v1/jobs: submit, read, list, cancel, a job's records, and its live events (SSE).

A user token sees only its own jobs (another owner's job is a 404, as if it did not exist);
an admin token sees every job (`api.job_service.get`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tuner.core.measurements import memory_bound
from tuner.db import dashboard
from tuner.db import jobs as jobs_db
from tuner.db.tables import JobState

from .. import job_service as jobs
from ..deps import CtxDep, UserDep
from ..events import SSE_HEADERS, event_stream, parse_last_event_id
from ..schemas import NO_NUL, OP, JobCreate, JobPage, JobPoints, JobPublic, Problem, RecordPage
from . import V1

router = APIRouter(prefix=f"{V1}/jobs", tags=["jobs"])

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem},
    422: {"model": Problem}, 429: {"model": Problem, "description": "rate limited"},
}
PAGED = {**_PROBLEMS, 400: {"model": Problem, "description": "`bad_cursor`: not a cursor "
                                                              "this API handed out"}}
CURSOR = ("The `next_cursor` of the previous page, unchanged (anything else: 400 "
          "`bad_cursor`).")
JOB_LOCATION = "/v1/jobs/{}"
# an Idempotency-Key: 1-200 visible ASCII characters (spaces inside only); empty -> 422
OWNER = ("Only this owner's jobs (an admin's filter; other tokens always see only their own "
         "jobs, so another owner gives an empty page).")
IDEMPOTENCY_KEY = r"^[!-~](?:[ -~]*[!-~])?$"


@router.post("", status_code=202, response_model=JobPublic, responses={
    **_PROBLEMS, 400: {"model": Problem, "description": "malformed JSON"},
    429: {"model": Problem, "description": "rate limited, or over a quota (`quota_exceeded`: "
                                           "queued jobs, trials per job, queued trials)"}})
async def submit_job(body: JobCreate, response: Response, ctx: CtxDep, principal: UserDep,
                     idempotency_key: Annotated[str | None, Header(
                         min_length=1, max_length=200, pattern=IDEMPOTENCY_KEY)] = None
                     ) -> JobPublic:
    """Validate and queue a tuning job, owned by the caller's token. With an
    `Idempotency-Key` (the caller's own: other owners' keys are unrelated), repeating the same
    request returns the same job; reusing the key for a different request is a 422
    `idempotency_conflict`. Over a quota: 429 `quota_exceeded` with `Retry-After`."""
    # a flood of new TVMScript texts while every parser is taken is refused here, before it
    # takes a thread or a query (the API's event loop keeps answering everyone else)
    if not ctx.resolver.knows(body.workload):
        ctx.resolver.gate.refuse_if_full()

    def submit() -> JobPublic:
        done = jobs.submit(ctx, body, idempotency_key, principal)
        response.headers["Location"] = JOB_LOCATION.format(done.job.id)
        response.headers["Retry-After"] = "2"
        return jobs_db.job_view(ctx.store, done.job, ctx.settings)

    return await run_in_threadpool(submit)


@router.get("", response_model=JobPage, responses=PAGED)
def list_jobs(ctx: CtxDep, principal: UserDep, state: JobState | None = None,
              op: Annotated[str | None, Query(pattern=OP, description=(
                  "Only jobs of this workload op (`matmul`, `conv2d`, `tir`, ...)"))] = None,
              owner: Annotated[str | None, Query(min_length=1, max_length=128, pattern=NO_NUL,
                                                 description=OWNER)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(description=CURSOR)] = None) -> JobPage:
    """The caller's jobs (an admin: everyone's), newest first, one page at a time (pass
    `next_cursor` back as `cursor`)."""
    if not jobs.may_list(principal, owner):
        return JobPage(items=[], next_cursor=None)
    rows, nxt = jobs_db.list_jobs(ctx.store, state=state, limit=limit, cursor=cursor,
                                  owner=jobs.list_owner(principal, owner), op=op)
    return JobPage(items=[jobs_db.job_view(ctx.store, r, ctx.settings) for r in rows],
                   next_cursor=nxt)


@router.get("/{job_id}", response_model=JobPublic, responses=_PROBLEMS)
def get_job(job_id: str, ctx: CtxDep, principal: UserDep) -> JobPublic:
    """One of the caller's jobs (an admin: any job), with its progress and best record."""
    return jobs_db.job_view(ctx.store, jobs.get(ctx, job_id, principal), ctx.settings)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic, responses=_PROBLEMS)
def cancel_job(job_id: str, ctx: CtxDep, principal: UserDep) -> JobPublic:
    """Cancel (idempotent): a queued job is cancelled at once, a running one stops after its
    current candidate (CANCELLING, then CANCELLED); finished jobs are left as they are."""
    return jobs_db.job_view(ctx.store, jobs.cancel(ctx, job_id, principal), ctx.settings)


@router.get("/{job_id}/records", response_model=RecordPage, responses=PAGED)
def job_records(job_id: str, ctx: CtxDep, principal: UserDep,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                cursor: Annotated[str | None, Query(description=CURSOR)] = None) -> RecordPage:
    """A job's measured records in the order they were stored."""
    items, nxt = jobs.records_page(ctx, job_id, principal, limit=limit, cursor=cursor)
    return RecordPage(items=items, next_cursor=nxt)


@router.get("/{job_id}/points", response_model=JobPoints, responses=_PROBLEMS)
def job_points(job_id: str, ctx: CtxDep, principal: UserDep) -> JobPoints:
    """Every measurement of the job as columns, in the order stored, without traces: what a
    chart of the job draws (the dashboard's tuning curve and records table)."""
    job = jobs.get(ctx, job_id, principal)
    stats = jobs_db.job_stats(ctx.store, job)
    return JobPoints(flops=stats.flops, nbytes=stats.nbytes,
                     memory_bound=memory_bound(stats.flops, stats.nbytes,
                                               ctx.settings.balance(stats.device_key)),
                     **dashboard.job_points(ctx.store, job.id, stats.flops))


@router.get("/{job_id}/points.csv", response_class=Response, responses={
    **_PROBLEMS, 200: {"content": {"text/csv": {}},
                       "description": "One row per record: the points' columns, then a column "
                                      "per knob"}})
def job_points_csv(job_id: str, ctx: CtxDep, principal: UserDep) -> Response:
    """The job's points (`/points`) as CSV, a column per knob (a tile's factors as JSON), for a
    spreadsheet or pandas; the dashboard's "CSV" download."""
    job = jobs.get(ctx, job_id, principal)
    flops = jobs_db.job_stats(ctx.store, job).flops
    body = dashboard.points_csv(dashboard.job_points(ctx.store, job.id, flops))
    return Response(body, media_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="job-{job.id[:8]}.csv"'})


@router.get("/{job_id}/events", response_class=StreamingResponse, responses={
    **_PROBLEMS, 400: {"model": Problem, "description": "`bad_event_id`: not a stream id"},
    200: {"content": {"text/event-stream": {}},
          "description": "Server-sent events: state, progress, record"}})
async def job_events(job_id: str, ctx: CtxDep, principal: UserDep,
                     last_event_id: Annotated[str | None, Header()] = None,
                     after: Annotated[str | None, Query(
                         description="Like Last-Event-ID, for clients that cannot set it")] = None
                     ) -> StreamingResponse:
    """The job's events as `text/event-stream`, replayed after `Last-Event-ID` (else from the
    start); the stream ends after a "state" event with a terminal state."""
    given = parse_last_event_id(after)  # checked even when the header wins
    start = parse_last_event_id(last_event_id) if last_event_id else given
    await run_in_threadpool(jobs.get, ctx, job_id, principal)  # 404 before the stream starts
    return StreamingResponse(event_stream(ctx, job_id, start), media_type="text/event-stream",
                             headers=SSE_HEADERS)
