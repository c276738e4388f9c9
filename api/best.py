"""The best-record lookup behind GET /v1/best, cached in Redis at `Keys.best(workload, target)`.

A warm lookup is: raw query -> (workload_key, target_key) from the in-process resolver map, one
Redis GET, an HMAC check, and the cached JSON bytes go out unchanged. Redis holds no authority:
each entry is `<hmac>.<json>`, signed over its key and text with the API's cache secret
(`TUNEFARM_CACHE_SECRET`, else a random one per process), and an entry that fails the check (one
written by anyone else) is a miss, read again from SQL and overwritten. A miss reads SQL and
replays the trace (TVM) in the thread pool and fills the cache. "No record yet" is cached
briefly too. The results endpoint invalidates the entry when a faster valid record lands;
entries also expire, which bounds staleness for records written around the API (e.g. `tunefarm
tune` on the same database). A worker's record is served only once a second measurement
confirmed it (`Store.best(served=True)`): the confirmation's result drops the entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

import redis
from starlette.concurrency import run_in_threadpool

from tuner.core.errors import NotFound
from tuner.interop.records import best_record

from .context import ApiContext
from .resolve import BestKey

log = logging.getLogger(__name__)

BEST_TTL_S = 300
MISSING_TTL_S = 5
MISSING = "null"


def _sign(ctx: ApiContext, key: str, text: str) -> str:
    mac = hmac.new(ctx.cache_secret, f"{key}\0{text}".encode(), hashlib.sha256).hexdigest()
    return f"{mac}.{text}"


def _verified(ctx: ApiContext, key: str, entry: object) -> str | None:
    """The text of a cache entry this API signed, else None (absent, or written by another)."""
    if entry is None:
        return None
    mac, sep, text = str(entry).partition(".")
    if sep and hmac.compare_digest(_sign(ctx, key, text), f"{mac}.{text}"):
        return text
    log.warning("best cache entry %s is not signed by this API; ignored", key)
    return None


def _load(ctx: ApiContext, bk: BestKey) -> str:
    try:
        rec = best_record(ctx.store, bk.workload, bk.target.as_dict, bk.device_key)
    except NotFound:
        return MISSING
    return json.dumps(rec, separators=(",", ":"))


async def lookup(ctx: ApiContext, workload: str, target: str, device_key: str,
                 who: str | None = None) -> str:
    """The best record's JSON text; NotFound when the workload has no valid record there. A new
    TVMScript spec is parsed only for a user `who` (`Resolver.best_key`)."""
    bk = ctx.resolver.cached_best_key(workload, target, device_key)
    if bk is None:
        bk = await run_in_threadpool(ctx.resolver.best_key, workload, target, device_key, who)
    key = ctx.keys.best(bk.workload_key, bk.target_key)
    try:
        cached = _verified(ctx, key, await ctx.redis.get(key))
    except (redis.RedisError, OSError) as exc:
        log.warning("best cache unavailable (%s); reading SQL", exc)
        cached = None
    if cached is None:
        cached = await run_in_threadpool(_load, ctx, bk)
        try:
            await ctx.redis.set(key, _sign(ctx, key, cached),
                                ex=MISSING_TTL_S if cached == MISSING else BEST_TTL_S)
        except (redis.RedisError, OSError) as exc:
            log.warning("best cache not filled: %s", exc)
    if cached == MISSING:
        raise NotFound(f"no valid record for {bk.workload.description} ({bk.workload_key}) on "
                       f"target {bk.target.json} / device {bk.device_key!r}: tune it first")
    return cached


def invalidate(ctx: ApiContext, workload_key: str, target_key: str,
               latency_s: float | None) -> bool:
    """Drop the cached best of (workload, target) if a record of `latency_s` beats it (or none
    was known; `latency_s` None: whatever it holds). True when an entry was dropped."""
    key = ctx.keys.best(workload_key, target_key)
    try:
        entry = ctx.sync_redis.get(key)
        if entry is None:
            return False
        cached = _verified(ctx, key, entry)
        if cached is None:
            return bool(ctx.sync_redis.delete(key))
        if cached != MISSING and latency_s is not None:
            known: Any = json.loads(cached).get("latency_s")
            if known is not None and latency_s >= float(known):
                return False
        return bool(ctx.sync_redis.delete(key))
    except (redis.RedisError, OSError, ValueError) as exc:
        log.warning("best cache of %s not invalidated: %s", workload_key, exc)
        return False
