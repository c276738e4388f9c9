"""The API's gate for TVMScript parse children: the one costly thing a request can make the API
do before any quota would count it (a child costs about 2 s of a core to start and parse).

    admit(who, texts)   a context manager around the parse of `texts` new TVMScript texts for
                        principal `who`: takes them from who's parse budget (`parse_per_min`
                        texts a minute, bursts of as many; else 429 `parse_budget`), then one of
                        `parse_slots` process-wide slots, waiting at most `parse_wait_s` and
                        behind at most `parse_queue` other requests (else 429 `parse_busy`)

A request that needs no child (a spec already parsed, an op spec) never enters. Both limits are
per API process, like the request rate (`api.ratelimit`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tuner.core.config import Settings

from .errors import ApiProblem
from .ratelimit import RateLimiter


class ParseGate:
    def __init__(self, slots: int, queue: int, wait_s: float, per_min: float) -> None:
        self.slots, self.queue, self.wait_s = max(1, slots), max(0, queue), wait_s
        self._sem = threading.BoundedSemaphore(self.slots)
        self._lock = threading.Lock()
        self._waiting = 0
        self._budget = RateLimiter(per_min / 60.0, max(1, int(per_min)))

    @classmethod
    def from_settings(cls, s: Settings) -> ParseGate:
        return cls(s.parse_slots, s.parse_queue, s.parse_wait_s, s.parse_per_min)

    @property
    def waiting(self) -> int:
        return self._waiting

    def refuse_if_full(self) -> None:
        """429 `parse_busy` at once when every slot and queue place is taken: what `admit`
        would answer, asked before any other work (on the event loop, no thread, no SQL)."""
        if self._waiting >= self.queue + self.slots:
            raise self._busy(f"{self._waiting} requests are parsing or waiting to")

    @contextmanager
    def admit(self, who: str, texts: int = 1) -> Iterator[None]:
        if texts <= 0:
            yield
            return
        self._take_budget(who, texts)
        with self._lock:
            if self._waiting >= self.queue + self.slots:
                raise self._busy(f"{self._waiting} requests are parsing or waiting to")
            self._waiting += 1
        try:
            if not self._sem.acquire(timeout=self.wait_s):
                raise self._busy(f"no parser free within {self.wait_s:g} s")
            try:
                yield
            finally:
                self._sem.release()
        finally:
            with self._lock:
                self._waiting -= 1

    def _take_budget(self, who: str, texts: int) -> None:
        b = self._budget
        if b.rate_per_s <= 0:
            return
        if texts > b.burst:
            raise ApiProblem("parse_budget", f"{texts} new TVMScript texts in one request; "
                             f"{who!r} may have at most {b.burst:g} parsed a minute")
        wait = b.take(who, n=texts)
        if wait > 0:
            raise ApiProblem("parse_budget", f"{who!r} has used its TVMScript parse budget "
                             f"({b.burst:g} new texts a minute); retry in {wait:.1f} s",
                             headers={"Retry-After": str(max(1, math.ceil(wait)))})

    def _busy(self, why: str) -> ApiProblem:
        return ApiProblem("parse_busy", f"the API's TVMScript parsers are busy ({why}); retry "
                          "shortly", headers={"Retry-After": str(max(1, math.ceil(self.wait_s)))})
