"""Dependencies of the routes, as `Annotated` aliases (`CtxDep`, `StoreDep`, `UserDep`, ...)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tuner.db.store import Store
from tuner.db.tokens import Principal, Scope

from .auth import authenticate, authorize
from .context import ApiContext
from .errors import ApiProblem
from .ratelimit import AUTH_FAILURES_BURST, AUTH_FAILURES_PER_S, RateLimiter

# documents the scheme in OpenAPI; the header itself is checked by `authenticate`
_bearer = HTTPBearer(auto_error=False, description="A tunefarm token (`tf_...`).")


# async: FastAPI runs a plain `def` dependency in the thread pool, a thread hop per request
async def get_ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


CtxDep = Annotated[ApiContext, Depends(get_ctx)]


async def get_store(ctx: CtxDep) -> Store:
    return ctx.store


StoreDep = Annotated[Store, Depends(get_store)]


def rate_limiter(ctx: ApiContext) -> RateLimiter:
    """This API process's per-principal request limiter (`ctx.extra["rate_limiter"]`, made
    from the settings `rate_per_s` and `rate_burst` on first use)."""
    limiter = ctx.extra.get("rate_limiter")
    if limiter is None:
        limiter = ctx.extra["rate_limiter"] = RateLimiter(ctx.settings.rate_per_s,
                                                          ctx.settings.rate_burst)
    assert isinstance(limiter, RateLimiter)
    return limiter


def refusal_limiter(ctx: ApiContext) -> RateLimiter:
    """This API process's limiter of refused tokens per client address (`AUTH_FAILURES_*`)."""
    limiter = ctx.extra.get("refusal_limiter")
    if limiter is None:
        limiter = ctx.extra["refusal_limiter"] = RateLimiter(AUTH_FAILURES_PER_S,
                                                             AUTH_FAILURES_BURST)
    assert isinstance(limiter, RateLimiter)
    return limiter


async def current_principal(
    request: Request, ctx: CtxDep,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The authenticated principal, within its request rate (else 429 `rate_limited`). A
    client address whose tokens were refused too often is answered 429 before any lookup."""
    address = f"address {request.client.host}" if request.client else "address unknown"
    refusals = refusal_limiter(ctx)
    refusals.check(address, peek=True)
    try:
        principal = await authenticate(ctx.tokens, request.headers.get("authorization"))
    except ApiProblem as exc:
        if exc.code == "unauthorized":
            refusals.take(address)
        raise
    rate_limiter(ctx).check(principal.owner)
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def require(*scopes: Scope) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency: the caller's principal if it has one of `scopes` (admin always does)."""

    async def check(principal: CurrentPrincipal) -> Principal:
        return authorize(principal, scopes)

    return check


UserDep = Annotated[Principal, Depends(require(Scope.USER))]
WorkerDep = Annotated[Principal, Depends(require(Scope.WORKER))]
ReaderDep = Annotated[Principal, Depends(require(Scope.USER, Scope.WORKER))]
AdminDep = Annotated[Principal, Depends(require())]
