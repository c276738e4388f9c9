"""Bearer tokens: `Authorization: Bearer tf_...`, checked against SQL (`tuner.db.tokens`).

Lookups are cached in-process for a short TTL so hot read paths (GET /v1/best) do not pay a SQL
round trip per request. A revoked token therefore keeps working for at most `ttl_s` seconds on an
API process that saw it recently; an unknown token is remembered as unknown for `negative_ttl_s`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from starlette.concurrency import run_in_threadpool

from tuner.db.store import Store
from tuner.db.tokens import Principal, Scope, verify_token

from .errors import ApiProblem

_UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="tunefarm"'}


class TokenCache:
    def __init__(self, store: Store, *, ttl_s: float = 30.0, negative_ttl_s: float = 5.0,
                 max_entries: int = 10_000) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(hit, principal) from the cache only."""
        digest = self._digest(token)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None or entry[0] < now:
                return False, None
            return True, entry[1]

    def remember(self, token: str, principal: Principal | None) -> None:
        ttl = self.ttl_s if principal is not None else self.negative_ttl_s
        with self._lock:
            self._entries[self._digest(token)] = (time.monotonic() + ttl, principal)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    async def verify(self, token: str) -> Principal | None:
        hit, principal = self.cached(token)
        if hit:
            return principal
        principal = await run_in_threadpool(verify_token, self.store, token)
        self.remember(token, principal)
        return principal


def unauthorized(detail: str) -> ApiProblem:
    return ApiProblem("unauthorized", detail, headers=_UNAUTHORIZED_HEADERS)


async def authenticate(cache: TokenCache, authorization: str | None) -> Principal:
    """The principal of an `Authorization` header value; 401 problems otherwise."""
    if not authorization:
        raise unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    principal = await cache.verify(token)
    if principal is None:
        raise unauthorized("invalid or revoked token")
    return principal


def authorize(principal: Principal, allowed: Iterable[Scope]) -> Principal:
    """`principal` if its scope is admin or one of `allowed`; else a 403 problem."""
    allowed = tuple(allowed)
    if principal.scope is Scope.ADMIN or principal.scope in allowed:
        return principal
    need = " or ".join(str(s) for s in allowed) or "admin"
    who = principal.name or f"#{principal.token_id}"
    raise ApiProblem("forbidden", f"this needs a {need} token; token {who!r} has scope "
                     f"{principal.scope}")
