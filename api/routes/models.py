"""/v1/models: submit a model job (the PrimFuncs a client extracted from its model), read it
with per-task progress and the estimated model latency, list, cancel. A model job's task jobs
are ordinary jobs (`GET /v1/jobs/{id}`, their records and events)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from tuner.db import model_jobs
from tuner.db.views import ModelPublic

from .. import model_service as models
from ..deps import CtxDep, UserDep
from ..job_service import list_owner
from ..schemas import ModelCreate, ModelPage, Problem
from . import V1
from .jobs import CURSOR, IDEMPOTENCY_KEY, PAGED

router = APIRouter(prefix=f"{V1}/models", tags=["models"])

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem},
    422: {"model": Problem}, 429: {"model": Problem, "description": "rate limited"},
}
MODEL_LOCATION = "/v1/models/{}"


@router.post("", status_code=202, response_model=ModelPublic, responses={
    **_PROBLEMS, 400: {"model": Problem, "description": "malformed JSON"},
    422: {"model": Problem, "description": "a bad task (`field`: `tasks.<i>.tvmscript`), "
                                           "target or option"},
    429: {"model": Problem, "description": "rate limited, or over a quota (`quota_exceeded`: "
                                           "a model job counts as one job with its budget)"}})
def submit_model(body: ModelCreate, response: Response, ctx: CtxDep, principal: UserDep,
                 idempotency_key: Annotated[str | None, Header(
                     min_length=1, max_length=200, pattern=IDEMPOTENCY_KEY)] = None
                 ) -> ModelPublic:
    """Vet every task's PrimFunc like a `tir` workload, queue the model job (owned by the
    caller's token) and start its first round. The budget is spread over the tasks, one round
    of `round_trials` at a time, by a gradient-based task scheduler."""
    model, _created = models.submit(ctx, body, idempotency_key, principal)
    response.headers["Location"] = MODEL_LOCATION.format(model.id)
    response.headers["Retry-After"] = "5"
    return ModelPublic.from_row(model)


@router.get("", response_model=ModelPage, responses=PAGED)
def list_models(ctx: CtxDep, principal: UserDep,
                limit: Annotated[int, Query(ge=1, le=200)] = 50,
                cursor: Annotated[str | None, Query(description=CURSOR)] = None) -> ModelPage:
    """The caller's model jobs (an admin: everyone's), newest first, one page at a time (pass
    `next_cursor` back as `cursor`)."""
    rows, nxt = model_jobs.list_models(ctx.store, owner=list_owner(principal), limit=limit,
                                       cursor=cursor)
    return ModelPage(items=[ModelPublic.from_row(r) for r in rows], next_cursor=nxt)


@router.get("/{model_id}", response_model=ModelPublic, responses=_PROBLEMS)
def get_model(model_id: str, ctx: CtxDep, principal: UserDep) -> ModelPublic:
    """One of the caller's model jobs: state, trials spent, the estimated model latency after
    each round, and every task's trials, best latency and task job."""
    return ModelPublic.from_row(models.get(ctx, model_id, principal))


@router.post("/{model_id}/cancel", status_code=202, response_model=ModelPublic,
             responses=_PROBLEMS)
def cancel_model(model_id: str, ctx: CtxDep, principal: UserDep) -> ModelPublic:
    """Cancel (idempotent): no new round starts; the round in flight is cancelled."""
    return ModelPublic.from_row(models.cancel(ctx, model_id, principal))
