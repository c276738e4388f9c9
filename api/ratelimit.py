"""Request rate limits: one token bucket per principal (`Principal.owner`: every token of one
name shares it), in this API process's memory; and one per client address for requests whose
token is refused, so guessing tokens costs the guesser, not the database.

A bucket holds up to `burst` requests and refills at `rate_per_s`; a request takes one. An empty
bucket answers 429 `rate_limited` with `Retry-After` (whole seconds until a request fits again).
The check is O(1) and runs no SQL or Redis (it sits on every authenticated request, GET /v1/best
included). Limits are per API process: N processes behind a balancer allow N times the rate.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable

from .errors import ApiProblem

# per client address and API process: refused tokens (401) per second, sustained and at once
AUTH_FAILURES_PER_S = 5.0
AUTH_FAILURES_BURST = 50


class RateLimiter:
    """Token buckets keyed by principal; the least recently used are dropped past
    `max_entries` (a dropped principal starts again with a full bucket)."""

    def __init__(self, rate_per_s: float, burst: int, *, max_entries: int = 10_000) -> None:
        self.rate_per_s = float(rate_per_s)
        self.burst = max(1.0, float(burst))
        self.max_entries = max_entries
        # key -> (tokens, when they were counted)
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: Hashable, now: float | None = None, *, peek: bool = False,
             n: float = 1.0) -> float:
        """Take `n` requests (one by default, at most `burst`) from `key`'s bucket: 0.0 when
        allowed, else the seconds until they would be (nothing is taken then). `peek`: only
        say so, take nothing."""
        if self.rate_per_s <= 0:  # a rate of 0 (or less): no limit
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate_per_s)
            wait = 0.0
            if tokens < n:
                wait = (n - tokens) / self.rate_per_s
            elif not peek:
                tokens -= n
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self.max_entries:
                self._buckets.popitem(last=False)
            return wait

    def check(self, who: str, *, peek: bool = False) -> None:
        """`take` from `who`'s bucket, raising the 429 `rate_limited` problem when it is
        empty."""
        wait = self.take(who, peek=peek)
        if wait > 0:
            raise ApiProblem("rate_limited",
                             f"too many requests from {who!r}: at most {self.rate_per_s:g}/s "
                             f"(bursts of {self.burst:g}); retry in {wait:.2f} s",
                             headers={"Retry-After": str(max(1, math.ceil(wait)))})
