"""/v1/tokens: admins create, list and revoke API tokens (`tuner.db.tokens` holds the SQL).

A created token's plaintext is in the 201 answer only; lists never carry a secret or a hash.
Revocation is effective on this API process at once and on every other within
`Settings.token_cache_s` (1 s)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from tuner.db import tokens as tokens_db
from tuner.db.tokens import TokenInfo

from ..deps import AdminDep, CtxDep, CurrentPrincipal
from ..schemas import DEVICE_KEY_PATTERN, Problem, Whoami, integral
from . import V1

router = APIRouter(prefix=f"{V1}/tokens", tags=["tokens"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}}
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The token's id.")]


Lifetime = Annotated[int, Field(ge=1, le=tokens_db.MAX_EXPIRES_S), BeforeValidator(integral)]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    scope: Literal["user", "worker", "admin"]
    name: str = Field(min_length=1, max_length=tokens_db.MAX_NAME_CHARS,
                      description="The principal: tokens of one name own the same jobs "
                                  "(rotation). Not \"local\" nor `token-<digits>`.")
    expires_in_s: Lifetime | None = Field(
        default=tokens_db.DEFAULT_EXPIRES_S,
        description="Lifetime in seconds (default 90 days); null: the token never expires.")
    device_key: str | None = Field(
        default=None, pattern=DEVICE_KEY_PATTERN,
        description="Worker tokens only: the one device key its workers may register for.")


class TokenPublic(BaseModel):
    id: int
    name: str
    scope: str
    device_key: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    state: Literal["active", "expired", "revoked"]

    @classmethod
    def of(cls, info: TokenInfo) -> TokenPublic:
        return cls.model_validate(info.to_dict())


class TokenCreated(TokenPublic):
    token: str = Field(description="The bearer token: shown this once, never stored.")


@router.post("", status_code=201, response_model=TokenCreated, responses=_PROBLEMS)
def create_token(body: TokenCreate, ctx: CtxDep, _: AdminDep) -> TokenCreated:
    """Create a token; its plaintext is in this answer only."""
    token, info = tokens_db.mint_token(ctx.store, body.scope, body.name,
                                       expires_in_s=body.expires_in_s,
                                       device_key=body.device_key)
    return TokenCreated(**TokenPublic.of(info).model_dump(), token=token)


@router.get("", response_model=list[TokenPublic], responses=_PROBLEMS)
def list_tokens(ctx: CtxDep, _: AdminDep) -> list[TokenPublic]:
    """Every token, newest first, revoked and expired ones included (no secrets)."""
    return [TokenPublic.of(t) for t in tokens_db.list_tokens(ctx.store)]


@router.delete("/{token_id}", status_code=204, response_class=Response,
               responses={**_PROBLEMS, 404: {"model": Problem}})
async def revoke_token(token_id: TokenId, ctx: CtxDep, _: AdminDep) -> Response:
    """Revoke a token for good (again: still 204); 404 `not_found` for an unknown id."""
    await run_in_threadpool(tokens_db.revoke_token, ctx.store, token_id)
    ctx.tokens.forget(token_id)
    return Response(status_code=204)


whoami_router = APIRouter(prefix=V1, tags=["tokens"])


@whoami_router.get("/whoami", response_model=Whoami, responses=_PROBLEMS)
async def whoami(ctx: CtxDep, principal: CurrentPrincipal) -> Whoami:
    """The calling token's principal (any scope) and the boards' declared fp32 peaks: what the
    dashboard shows after sign-in, and what it needs for "% of peak"."""
    return Whoami(name=principal.name, scope=str(principal.scope), owner=principal.owner,
                  device_key=principal.device_key, peak_gflops=dict(ctx.settings.peak_gflops),
                  peak_gbps=dict(ctx.settings.peak_gbps))
