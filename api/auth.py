"""Bearer tokens: `Authorization: Bearer tf_...`, checked against SQL (`tuner.db.tokens`).

Lookups are cached in-process for a short TTL (`Settings.token_cache_s`, 1 s) so hot read paths
(GET /v1/best) do not pay a SQL round trip per request. A revoked token therefore keeps working
for at most `ttl_s` seconds on an API process that saw it recently (none on the process that
revoked it: `forget`); an expired one stops at its expiry on every process. An unknown token is
remembered as unknown for `negative_ttl_s`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from starlette.concurrency import run_in_threadpool

from tuner.db.store import Store
from tuner.db.tokens import Principal, Refusal, Scope, check_token, hash_token

from .errors import ApiProblem

_UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="tunefarm"'}
# what a refused token is told: expired/revoked only reach a caller holding a real token
_REFUSED = {
    Refusal.INVALID: "invalid token",
    Refusal.REVOKED: "this token was revoked; ask an admin for a new one",
    Refusal.EXPIRED: "this token has expired; ask an admin for a new one "
                     "(`tunefarm token create`)",
}


class TokenCache:
    def __init__(self, store: Store, *, ttl_s: float = 1.0, negative_ttl_s: float = 5.0,
                 max_entries: int = 10_000) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, Principal | Refusal]] = OrderedDict()
        self._lock = threading.Lock()
        self._lookups: dict[str, asyncio.Future[Principal | Refusal]] = {}  # digest -> lookup

    _digest = staticmethod(hash_token)  # what the tokens table stores, never the token

    def cached(self, token: str) -> tuple[bool, Principal | Refusal]:
        """(hit, principal or refusal) from the cache only; a cached principal whose token
        has expired since is a refusal."""
        digest = self._digest(token)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None or entry[0] < now:
                return False, Refusal.INVALID
            found = entry[1]
        if isinstance(found, Principal) and found.expired():
            return True, Refusal.EXPIRED
        return True, found

    def remember(self, token: str, found: Principal | Refusal) -> None:
        ttl = self.negative_ttl_s if found is Refusal.INVALID else self.ttl_s
        with self._lock:
            self._entries[self._digest(token)] = (time.monotonic() + ttl, found)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, token_id: int) -> None:
        """Drop the cached principal of token `token_id` (this process revoked it)."""
        with self._lock:
            for digest in [d for d, (_, found) in self._entries.items()
                           if isinstance(found, Principal) and found.token_id == token_id]:
                del self._entries[digest]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    async def check(self, token: str) -> Principal | Refusal:
        """The token's principal, else why it is refused (see `tuner.db.tokens.check_token`).
        One lookup per token at a time: requests that miss the cache while it runs wait for
        its answer (at hundreds of requests per second an expiring entry would otherwise send
        a burst of identical lookups to the database, once per `ttl_s`)."""
        hit, found = self.cached(token)
        if hit:
            return found
        digest = self._digest(token)
        pending = self._lookups.get(digest)
        if pending is None:
            pending = self._lookups[digest] = asyncio.ensure_future(
                run_in_threadpool(check_token, self.store, token))
            pending.add_done_callback(lambda _f: self._lookups.pop(digest, None))
        found = await asyncio.shield(pending)
        self.remember(token, found)
        return found

    async def verify(self, token: str) -> Principal | None:
        found = await self.check(token)
        return found if isinstance(found, Principal) else None


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
    found = await cache.check(token)
    if isinstance(found, Principal):
        return found
    raise unauthorized(_REFUSED[found])


def authorize(principal: Principal, allowed: Iterable[Scope]) -> Principal:
    """`principal` if its scope is admin or one of `allowed`; else a 403 problem."""
    allowed = tuple(allowed)
    if principal.scope is Scope.ADMIN or principal.scope in allowed:
        return principal
    need = " or ".join(str(s) for s in allowed) or "admin"
    who = principal.name or f"#{principal.token_id}"
    raise ApiProblem("forbidden", f"this needs a {need} token; token {who!r} has scope "
                     f"{principal.scope}")
