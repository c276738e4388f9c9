"""/v1/best: the fastest known schedule of a workload on a target (hot path: Redis only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from tuner.db import dashboard
from tuner.db.tokens import Scope

from .. import best
from ..deps import CtxDep, ReaderDep
from ..schemas import DEVICE_KEY_PATTERN, OP, BestPublic, Problem, WorkloadBest
from . import V1

router = APIRouter(prefix=V1, tags=["best"])


@router.get("/best", response_model=BestPublic, response_class=Response, responses={
    401: {"model": Problem}, 403: {"model": Problem},
    404: {"model": Problem, "description": "no valid record yet"}, 422: {"model": Problem},
    429: {"model": Problem}})
async def get_best(
    ctx: CtxDep, principal: ReaderDep,
    workload: Annotated[str, Query(min_length=1, max_length=65536, description=(
        "A workload key (e.g. matmul-0123456789abcdef) or the workload spec as JSON"))],
    target: Annotated[str, Query(max_length=4096, description=(
        '"host" (the API machine\'s CPU) or a target as JSON'))] = "host",
    device_key: Annotated[str, Query(pattern=DEVICE_KEY_PATTERN)] = "local",
) -> Response:
    """The best record (tuner.interop.records.best_record): latency, GFLOPS, the replayable trace
    and the
    schedule as Python. A TVMScript spec this API has not parsed yet is parsed for user tokens
    only, within their parse budget (429 `parse_budget`, `parse_busy`); workers ask by key."""
    who = None if principal.scope is Scope.WORKER else principal.owner
    body = await best.lookup(ctx, workload, target, device_key, who)
    return Response(body, media_type="application/json")


@router.get("/workloads", response_model=list[WorkloadBest], responses={
    401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})
async def list_best(
    ctx: CtxDep, principal: ReaderDep,
    op: Annotated[str | None, Query(pattern=OP, description="Only workloads of this op")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[WorkloadBest]:
    """Every workload × target with a valid record, most recently measured first: its best
    latency and GFLOPS, and the speed-up of the best over the first valid candidate measured
    there. Shared like GET /v1/best: no TVMScript, no job or owner; a model's PrimFunc is named
    by the caller's own model tasks (`task_names`)."""
    names_of = None if principal.scope is Scope.WORKER else principal.owner
    rows = await run_in_threadpool(dashboard.best_table, ctx.store, limit=limit, op=op,
                                   names_of=names_of, every_owner=principal.scope is Scope.ADMIN)
    return [WorkloadBest(**row.as_dict()) for row in rows]
