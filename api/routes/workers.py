"""/v1/workers: measurement workers register, heartbeat and post their results here."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tuner.db import workers as workers_db

from .. import results
from ..deps import CtxDep, UserDep, WorkerDep
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


@router.post("", status_code=201, response_model=WorkerRegistered, responses=_PROBLEMS)
def register_worker(body: WorkerCreate, ctx: CtxDep, _: WorkerDep) -> dict[str, Any]:
    """Register a worker; the answer tells it the farm's lease and heartbeat settings."""
    tgt = ctx.resolver.target(body.target)
    row = workers_db.register_worker(
        ctx.store, name=body.name, device_key=body.device_key, target_json=tgt.json,
        capabilities=body.capabilities, tvm_version=body.tvm_version, hostname=body.hostname)
    s = ctx.settings
    return {"id": row.id, "lease_s": s.lease_s, "heartbeat_s": s.heartbeat_s,
            "max_deliveries": s.max_deliveries, "redis_prefix": s.redis_prefix,
            "queue_wait_s": s.queue_wait_s}


@router.post("/{worker_id}/heartbeat", response_model=WorkerPublic,
             responses={**_PROBLEMS, 404: {"model": Problem}})
def heartbeat(worker_id: str, body: Heartbeat, ctx: CtxDep, _: WorkerDep) -> dict[str, Any]:
    row = workers_db.heartbeat(ctx.store, worker_id, state=body.state, measured=body.measured,
                               failures=body.failures, infra_failures=body.infra_failures)
    return row.to_dict()


@router.post("/{worker_id}/results", response_model=ResultPublic, responses=_PROBLEMS)
def post_result(worker_id: str, body: ResultCreate, ctx: CtxDep, _: WorkerDep) -> dict[str, Any]:
    """Commit one measured trial (idempotent per trial id: a repeated post answers
    `inserted: false`). The worker acknowledges its queue entry only after this answered 200."""
    return results.commit(ctx, worker_id, body)


@router.get("", response_model=list[WorkerPublic], responses=_PROBLEMS)
def list_workers(ctx: CtxDep, _: UserDep) -> list[dict[str, Any]]:
    """Registered workers, newest first; one silent for three heartbeats shows "offline"."""
    stale = max(3 * ctx.settings.heartbeat_s, 10.0)
    return [w.to_dict() for w in workers_db.list_workers(ctx.store, stale_after_s=stale)]
