"""Liveness (/healthz), readiness (/readyz: SQL and Redis answer) and Prometheus /metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from ..deps import CtxDep
from ..errors import problem
from ..schemas import Health, Problem

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
CHECK_TIMEOUT_S = 3.0


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> dict[str, str]:
    """The process is up (no dependency is checked)."""
    return {"status": "ok"}


def _sql_ok(ctx: CtxDep) -> None:
    with ctx.store.engine.connect() as conn:
        conn.execute(text("SELECT 1"))


async def _check(name: str, coro: Awaitable[object]) -> str:
    try:
        await asyncio.wait_for(coro, CHECK_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        log.warning("readiness: %s is not answering: %s", name, exc)
        return f"error: {type(exc).__name__}"
    return "ok"


@router.get("/readyz", response_model=Health,
            responses={503: {"model": Problem, "description": "SQL or Redis is not answering"}})
async def readyz(ctx: CtxDep) -> Response:
    """Ready when PostgreSQL/SQLite and Redis answer."""
    checks = {"sql": await _check("sql", run_in_threadpool(_sql_ok, ctx)),
              "redis": await _check("redis", ctx.redis.ping())}
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ok", "checks": checks})
    bad = ", ".join(f"{k} ({v})" for k, v in checks.items() if v != "ok")
    return problem(503, "unavailable", f"not ready: {bad}", instance="/readyz", checks=checks,
                   headers={"Retry-After": "5"})


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(ctx: CtxDep) -> Response:
    """Prometheus text format: requests by route, jobs by state, records total."""
    registry = ctx.extra["metrics"].registry
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
