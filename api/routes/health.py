"""Liveness (/healthz), readiness (/readyz: SQL and Redis answer) and Prometheus /metrics
(behind `Authorization: Bearer <TUNEFARM_METRICS_TOKEN>` when that is set)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable
from typing import Annotated

from fastapi import APIRouter, Header, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from tuner.db import stats

from ..auth import unauthorized
from ..deps import CtxDep
from ..errors import problem
from ..schemas import Health, Problem

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
CHECK_TIMEOUT_S = 3.0


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> Health:
    """The process is up (no dependency is checked)."""
    return Health(status="ok")


async def _check(name: str, coro: Awaitable[object]) -> str:
    try:
        await asyncio.wait_for(coro, CHECK_TIMEOUT_S)
    except Exception as exc:  # any failure means "not ready"
        log.warning("readiness: %s is not answering: %s", name, exc)
        return f"error: {type(exc).__name__}"
    return "ok"


@router.get("/readyz", response_model=Health,
            responses={503: {"model": Problem, "description": "SQL or Redis is not answering"}})
async def readyz(ctx: CtxDep) -> Health | Response:
    """Ready when PostgreSQL/SQLite and Redis answer."""
    checks = {"sql": await _check("sql", run_in_threadpool(stats.ping, ctx.store)),
              "redis": await _check("redis", ctx.redis.ping())}
    if all(v == "ok" for v in checks.values()):
        return Health(status="ok", checks=checks)
    bad = ", ".join(f"{k} ({v})" for k, v in checks.items() if v != "ok")
    return problem(503, "unavailable", f"not ready: {bad}", instance="/readyz", checks=checks,
                   headers={"Retry-After": "5"})


def _check_metrics_token(expected: str | None, authorization: str | None) -> None:
    """Nothing when no metrics token is set or the header carries it; else a 401 problem."""
    if not expected:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                             expected.encode()):
        raise unauthorized("/metrics needs 'Authorization: Bearer <the metrics token>'")


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {CONTENT_TYPE_LATEST: {}}},
    401: {"model": Problem, "description": "a metrics token is set and was not sent"}})
async def metrics(ctx: CtxDep, authorization: Annotated[str | None, Header(
        include_in_schema=False)] = None) -> Response:
    """Prometheus text format: requests by route, jobs by state, records total. When the server
    has a metrics token (TUNEFARM_METRICS_TOKEN), send it as `Authorization: Bearer <token>`."""
    _check_metrics_token(ctx.settings.metrics_token, authorization)
    registry = ctx.extra["metrics"].registry
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
