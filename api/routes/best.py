"""/v1/best: the fastest known schedule of a workload on a target (hot path: Redis only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from .. import best
from ..deps import CtxDep, ReaderDep
from ..schemas import DEVICE_KEY_PATTERN, BestPublic, Problem
from . import V1

router = APIRouter(prefix=V1, tags=["best"])


@router.get("/best", response_model=BestPublic, response_class=Response, responses={
    401: {"model": Problem}, 403: {"model": Problem},
    404: {"model": Problem, "description": "no valid record yet"}, 422: {"model": Problem}})
async def get_best(
    ctx: CtxDep, _: ReaderDep,
    workload: Annotated[str, Query(min_length=1, max_length=65536, description=(
        "A workload key (e.g. matmul-0123456789abcdef) or the workload spec as JSON"))],
    target: Annotated[str, Query(max_length=4096, description=(
        '"host" (the API machine\'s CPU) or a target as JSON'))] = "host",
    device_key: Annotated[str, Query(pattern=DEVICE_KEY_PATTERN)] = "local",
) -> Response:
    """The best record (tuner.records.best_record): latency, GFLOPS, the replayable trace and the
    schedule as Python."""
    body = await best.lookup(ctx, workload, target, device_key)
    return Response(body, media_type="application/json")
