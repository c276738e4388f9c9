"""/v1/workers/{id}/lease|renew|ack|dead-letter: a worker takes its measurements through the
API (it holds no Redis credentials). Each call acts as the worker `id`, which only the token
that registered it (or an admin) may do; the queue is the worker's registered device key's
(see `api.work`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from starlette.concurrency import run_in_threadpool

from tuner.db import workers as workers_db
from tuner.db.tokens import Principal, Scope
from tuner.db.workers import WorkerRow

from .. import work
from ..context import ApiContext
from ..deps import CtxDep, WorkerDep
from ..schemas import Problem
from . import V1

router = APIRouter(prefix=f"{V1}/workers", tags=["workers"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem}, 401: {"model": Problem}, 403: {"model": Problem},
    404: {"model": Problem}, 422: {"model": Problem}, 503: {"model": Problem}}

WorkerId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                               description="The id the registration answered.")]


def _acting(ctx: ApiContext, worker_id: str, principal: Principal) -> WorkerRow:
    return workers_db.acting_as(ctx.store, worker_id, principal.token_id,
                                admin=principal.scope is Scope.ADMIN)


@router.post("/{worker_id}/lease", response_model=work.Lease, responses=_PROBLEMS)
async def lease(worker_id: WorkerId, body: work.LeaseRequest, ctx: CtxDep,
                principal: WorkerDep) -> work.Lease:
    """Up to `max` measurements of the worker's device key: entries a dead worker held past
    the lease first, else new ones (waiting up to `wait_s`). Keep them with `renew` while
    measuring; `ack` each after its result was posted and answered 200."""
    worker = await run_in_threadpool(_acting, ctx, worker_id, principal)
    return work.Lease(entries=await work.lease(ctx, worker, body.max, body.wait_s))


@router.post("/{worker_id}/renew", response_model=work.EntryIdsPublic, responses=_PROBLEMS)
def renew(worker_id: WorkerId, body: work.EntryIds, ctx: CtxDep,
          principal: WorkerDep) -> work.EntryIdsPublic:
    """Renew the lease of entries this worker holds; answers the ids it still holds."""
    worker = _acting(ctx, worker_id, principal)
    return work.EntryIdsPublic(entry_ids=work.renew(ctx, worker, body.entry_ids))


@router.post("/{worker_id}/ack", response_model=work.EntryIdsPublic, responses=_PROBLEMS)
def ack(worker_id: WorkerId, body: work.EntryIds, ctx: CtxDep,
        principal: WorkerDep) -> work.EntryIdsPublic:
    """Acknowledge entries this worker holds (their results were posted); answers those ids."""
    worker = _acting(ctx, worker_id, principal)
    return work.EntryIdsPublic(entry_ids=work.ack(ctx, worker, body.entry_ids))


@router.post("/{worker_id}/dead-letter", response_model=work.EntryIdsPublic,
             responses=_PROBLEMS)
def dead_letter(worker_id: WorkerId, body: work.DeadLetterRequest, ctx: CtxDep,
                principal: WorkerDep) -> work.EntryIdsPublic:
    """Give up on entries this worker holds (the API rejected their results for good): they
    are moved to the dead letters and the tuner stops waiting for them."""
    worker = _acting(ctx, worker_id, principal)
    return work.EntryIdsPublic(entry_ids=work.dead_letter(ctx, worker, body.entry_ids,
                                                          body.reason))
