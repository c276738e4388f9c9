"""The FastAPI app factory and the uvicorn entry point.

    app = create_app(Settings(database_url=..., redis_url=...))   # tests, embedding
    serve()                                                        # `tunefarm serve`

Nothing connects at import time: the SQL store and the Redis clients are opened in the app's
lifespan (so `TestClient(app)` must be used as a context manager).
"""

from __future__ import annotations

import gc
import importlib.metadata
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from tuner.core.config import Settings, get_settings
from tuner.workloads import isolate

from . import errors, openapi
from .context import ApiContext
from .hygiene import BodyLimitMiddleware, NulFreeUrlMiddleware
from .metrics import Metrics, MetricsMiddleware
from .routes import best, docs, health, jobs, models, spaces, tokens, ui, work, workers

log = logging.getLogger(__name__)

DESCRIPTION = """Autotuning of tensor programs on Apache TVM: submit tuning jobs, follow them
(server-sent events), and look up the best known schedule of a workload on a target.

Authenticate with `Authorization: Bearer <token>`; scopes: user, worker, admin. Errors are
RFC 9457 `application/problem+json` with a stable `code`."""


def _version() -> str:
    try:
        return importlib.metadata.version("tunefarm")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _warm_up(ctx: ApiContext) -> None:
    ctx.resolver.warm_up()
    isolate.prestart()  # TVMScript's parse children: their fork server, before the first text
    try:
        ctx.resolver.target("host")
    except Exception:
        log.exception("could not resolve the host target at start-up")


def create_app(settings: Settings | None = None, *, freeze_gc: bool = False) -> FastAPI:
    """The tunefarm API; `settings` default to the environment (TUNEFARM_*). `freeze_gc` (the
    server does it) moves everything loaded at start-up (TVM, templates) out of the garbage
    collector's sight, which keeps its pauses off the p99 of hot requests."""
    settings = settings or get_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = await run_in_threadpool(ApiContext.open, settings)
        ctx.extra["metrics"] = metrics
        metrics.store = ctx.store
        await run_in_threadpool(_warm_up, ctx)
        app.state.ctx = ctx
        if freeze_gc:
            gc.collect()
            gc.freeze()
        log.info("tunefarm API ready: database %s, redis prefix %r", ctx.store.safe_url,
                 settings.redis_prefix)
        try:
            yield
        finally:
            await ctx.aclose()

    app = FastAPI(title="tunefarm", version=_version(), description=DESCRIPTION,
                  openapi_url="/v1/openapi.json", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.settings = settings
    errors.install(app)
    openapi.install(app)
    app.add_middleware(NulFreeUrlMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts 413s too
    for module in (jobs, models, best, spaces, workers, work, tokens, health, ui, docs):
        app.include_router(module.router)
    app.include_router(tokens.whoami_router)
    ui.mount(app)
    docs.mount(app)
    return app


def serve(settings: Settings | None = None, *, host: str | None = None, port: int | None = None,
          log_level: str = "warning") -> None:
    """Run the API under uvicorn (blocks until SIGINT/SIGTERM). No access log: a line per
    request costs the hot path (`/metrics` counts requests). An open event stream does not hold
    up a shutdown: its client reconnects with Last-Event-ID."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    settings = settings or get_settings()
    # with TUNEFARM_LOG_FORMAT=json uvicorn's own lines go through the root logger's JSON
    # formatter (`tuner.core.logs.setup`, done by `tunefarm serve`) instead of its text handlers
    log_config = None if settings.log_format == "json" else LOGGING_CONFIG
    uvicorn.run(create_app(settings, freeze_gc=True), host=host or settings.api_host,
                port=port or settings.api_port, log_level=log_level, access_log=False,
                proxy_headers=True, timeout_graceful_shutdown=5, log_config=log_config)
