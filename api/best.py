"""The best-record lookup behind GET /v1/best, cached in Redis at `Keys.best(workload, target)`.

A warm lookup is: raw query -> (workload_key, target_key) from the in-process resolver map, one
Redis GET, and the cached JSON bytes go out unchanged. A miss reads SQL and replays the trace
(TVM) in the thread pool and fills the cache. "No record yet" is cached briefly too. The results
endpoint invalidates the entry when a faster valid record lands; entries also expire, which
bounds staleness for records written around the API (e.g. `tunefarm tune` on the same database).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from starlette.concurrency import run_in_threadpool

from tuner.errors import NotFound
from tuner.records import best_record

from .context import ApiContext
from .resolve import BestKey

log = logging.getLogger(__name__)

BEST_TTL_S = 300
MISSING_TTL_S = 5
MISSING = "null"


def _load(ctx: ApiContext, bk: BestKey) -> str:
    try:
        rec = best_record(ctx.store, bk.workload, bk.target.as_dict, bk.device_key)
    except NotFound:
        return MISSING
    return json.dumps(rec, separators=(",", ":"))


async def lookup(ctx: ApiContext, workload: str, target: str, device_key: str) -> str:
    """The best record's JSON text; NotFound when the workload has no valid record there."""
    bk = ctx.resolver.cached_best_key(workload, target, device_key)
    if bk is None:
        bk = await run_in_threadpool(ctx.resolver.best_key, workload, target, device_key)
    key = ctx.keys.best(bk.workload_key, bk.target_key)
    try:
        hit: Any = await ctx.redis.get(key)  # a str (decode_responses) or None
        cached = None if hit is None else str(hit)
    except (redis.RedisError, OSError) as exc:
        log.warning("best cache unavailable (%s); reading SQL", exc)
        cached = None
    if cached is None:
        cached = await run_in_threadpool(_load, ctx, bk)
        try:
            await ctx.redis.set(key, cached, ex=MISSING_TTL_S if cached == MISSING else BEST_TTL_S)
        except (redis.RedisError, OSError) as exc:
            log.warning("best cache not filled: %s", exc)
    if cached == MISSING:
        raise NotFound(f"no valid record for {bk.workload.description} ({bk.workload_key}) on "
                       f"target {bk.target.json} / device {bk.device_key!r}: tune it first")
    return cached


def invalidate(ctx: ApiContext, workload_key: str, target_key: str, latency_s: float) -> bool:
    """Drop the cached best of (workload, target) if a record of `latency_s` beats it (or none
    was known). True when an entry was dropped."""
    key = ctx.keys.best(workload_key, target_key)
    try:
        cached = ctx.sync_redis.get(key)
        if cached is None:
            return False
        if cached != MISSING:
            known: Any = json.loads(cached).get("latency_s")
            if known is not None and latency_s >= float(known):
                return False
        return bool(ctx.sync_redis.delete(key))
    except (redis.RedisError, OSError, ValueError) as exc:
        log.warning("best cache of %s not invalidated: %s", workload_key, exc)
        return False
