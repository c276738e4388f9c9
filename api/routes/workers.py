"""/v1/workers: measurement workers register, heartbeat and post their results here.

A worker is bound to the token that registered it: heartbeats and results for `{worker_id}` are
accepted only from that token (or an admin's): 403 `forbidden` for another token's worker, 404
`not_found` for an unknown one. A worker token bound to a device key (`tunefarm token create
--device-key`) registers workers of that key only (403 `forbidden` otherwise), so it leases and
posts results for that key only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from tuner.db import workers as workers_db
from tuner.db.tokens import Principal, Scope
from tuner.db.workers import WorkerRow

from .. import results
from ..context import ApiContext
from ..deps import CtxDep, UserDep, WorkerDep
from ..errors import ApiProblem
from ..schemas import (
    Heartbeat,
    Problem,
    ResultCreate,
    ResultPublic,
    WorkerCreate,
    WorkerPublic,
    WorkerRegistered,
)
from . import V1

router = APIRouter(prefix=f"{V1}/workers", tags=["workers"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}}
WorkerId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                               description="The id the registration answered.")]
_ACTING: dict[int | str, dict[str, Any]] = {**_PROBLEMS, 404: {"model": Problem}}


def _acting(ctx: ApiContext, worker_id: str, principal: Principal) -> WorkerRow:
    """The worker `worker_id`, if `principal` registered it (admins act as any worker)."""
    return workers_db.acting_as(ctx.store, worker_id, principal.token_id,
                                admin=principal.scope is Scope.ADMIN)


@router.post("", status_code=201, response_model=WorkerRegistered, responses=_PROBLEMS)
def register_worker(body: WorkerCreate, ctx: CtxDep, principal: WorkerDep) -> WorkerRegistered:
    """Register a worker, bound to the calling token (only it may act as the worker); the
    answer tells it the farm's lease and heartbeat settings."""
    bound = principal.device_key
    if bound is not None and body.device_key != bound:
        raise ApiProblem("forbidden", f"this worker token is bound to device key {bound!r}; it "
                         f"may not register a worker for {body.device_key!r}",
                         device_key=body.device_key)
    tgt = ctx.resolver.target(body.target)
    row = workers_db.register_worker(
        ctx.store, name=body.name, device_key=body.device_key, target_json=tgt.json,
        capabilities=body.capabilities, tvm_version=body.tvm_version, hostname=body.hostname,
        token_id=principal.token_id)
    s = ctx.settings
    return WorkerRegistered(id=row.id, lease_s=s.lease_s, heartbeat_s=s.heartbeat_s,
                            max_deliveries=s.max_deliveries, queue_wait_s=s.queue_wait_s)


@router.post("/{worker_id}/heartbeat", response_model=WorkerPublic, responses=_ACTING)
def heartbeat(worker_id: WorkerId, body: Heartbeat, ctx: CtxDep,
              principal: WorkerDep) -> WorkerPublic:
    """The worker is alive; its state and counters as it reports them."""
    _acting(ctx, worker_id, principal)
    row = workers_db.heartbeat(ctx.store, worker_id, state=body.state, measured=body.measured,
                               failures=body.failures, infra_failures=body.infra_failures)
    return WorkerPublic.from_row(row)


@router.post("/{worker_id}/results", response_model=ResultPublic,
             responses={**_ACTING, 409: {"model": Problem}})
def post_result(worker_id: WorkerId, body: ResultCreate, ctx: CtxDep,
                principal: WorkerDep) -> ResultPublic:
    """Commit one measured trial, accepted only for a trial the tuner issued to this worker's
    device key and leased to this worker, unexpired, once (409 `unknown_trial`, `trial_mismatch`,
    `not_lease_holder`, `trial_used`; the same result posted again answers `inserted: false`).
    The worker acknowledges its queue entry only after this answered 200."""
    return results.commit(ctx, _acting(ctx, worker_id, principal), body)


@router.get("", response_model=list[WorkerPublic], responses=_PROBLEMS)
def list_workers(ctx: CtxDep, _: UserDep) -> list[WorkerPublic]:
    """Registered workers, newest first; one silent for three heartbeats shows "offline"."""
    stale = max(3 * ctx.settings.heartbeat_s, 10.0)
    return [WorkerPublic.from_row(w)
            for w in workers_db.list_workers(ctx.store, stale_after_s=stale)]
