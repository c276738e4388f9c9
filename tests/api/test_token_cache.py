"""The API's token cache (pure logic: the lookup itself is replaced)."""

from __future__ import annotations

import pytest


def test_concurrent_misses_share_one_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """When a cached token expires under load, the requests that miss wait for one lookup
    instead of each sending its own to the database."""
    import asyncio
    import time

    from api import auth
    from tuner.db.tokens import Principal, Scope

    calls: list[str] = []

    def slow_check(_store: object, token: str) -> Principal:
        calls.append(token)
        time.sleep(0.2)
        return Principal(1, "alice", Scope.USER)

    monkeypatch.setattr(auth, "check_token", slow_check)
    cache = auth.TokenCache(store=None, ttl_s=60)  # type: ignore[arg-type]

    async def burst() -> list[object]:
        return await asyncio.gather(*(cache.check("tf_x") for _ in range(20)))

    found = asyncio.run(burst())
    assert calls == ["tf_x"] and all(f == found[0] for f in found)
    assert cache.cached("tf_x") == (True, found[0])
