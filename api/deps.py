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


async def current_principal(
    request: Request, ctx: CtxDep,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return await authenticate(ctx.tokens, request.headers.get("authorization"))


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
