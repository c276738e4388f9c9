"""What one running API holds: settings, the SQL store, Redis clients, key names and caches.

Built in the app's lifespan (never at import time) and reached through `api.deps`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from tuner.core.config import Settings
from tuner.db.store import Store
from tuner.queue.keys import Keys

from .auth import TokenCache
from .parsegate import ParseGate
from .resolve import Resolver

log = logging.getLogger(__name__)


@dataclass
class ApiContext:
    settings: Settings
    store: Store
    redis: AsyncRedis  # async routes (best, events, health)
    sync_redis: Redis  # sync routes running in the thread pool (publishing)
    keys: Keys
    tokens: TokenCache
    resolver: Resolver
    cache_secret: bytes = field(default_factory=lambda: os.urandom(32))  # signs Redis entries
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, settings: Settings) -> ApiContext:
        store = Store(settings.resolved_database_url())
        kw: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": 3,
                              "socket_timeout": 10, "health_check_interval": 30}
        secret = settings.cache_secret.encode() if settings.cache_secret else os.urandom(32)
        return cls(settings=settings, store=store,
                   redis=AsyncRedis.from_url(settings.redis_url, **kw),
                   sync_redis=Redis.from_url(settings.redis_url, **kw),
                   keys=Keys(settings.redis_prefix),
                   tokens=TokenCache(store, ttl_s=settings.token_cache_s),
                   resolver=Resolver(store, ParseGate.from_settings(settings)),
                   cache_secret=secret)

    async def aclose(self) -> None:
        try:
            await self.redis.aclose()
        except Exception:
            log.debug("closing async redis failed", exc_info=True)
        self.sync_redis.close()
        self.store.close()
