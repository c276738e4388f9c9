"""Whether any worker serves a job's device key, asked while its trials wait on the farm: a job
never waits in silence. The reason it waits (no live worker of the key; every one quarantined)
is reported (the runner stores it as the job's `message`: the job page and `GET /v1/jobs/{id}`
show it), and a key without a live worker for `give_up_s` ends the job with that reason."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from tuner.core.errors import TunefarmError
from tuner.db import workers as workers_db
from tuner.db.store import Store


class NoLiveWorker(TunefarmError):
    """No worker of the job's device key was alive for the whole `give_up_s`."""

    code = "no_live_worker"


class WorkerWatch:
    def __init__(self, store: Store, device_key: str, report: Callable[[str | None], None], *,
                 give_up_s: float, stale_after_s: float, every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.device_key, self.report = store, device_key, report
        self.give_up_s, self.stale_after_s, self.every_s = give_up_s, stale_after_s, every_s
        self.clock = clock
        self._last = -math.inf
        self._since: float | None = None  # when the key was last seen without a live worker
        self._reported: str | None = None

    def check(self) -> None:
        """Look again (every `every_s`); raises NoLiveWorker past `give_up_s` without one."""
        now = self.clock()
        if now - self._last < self.every_s:
            return
        self._last = now
        live, quarantined = workers_db.serving(self.store, self.device_key,
                                               stale_after_s=self.stale_after_s)
        key = self.device_key
        reason = None
        if not live:
            reason = (f"waiting: every worker of device key {key!r} is quarantined "
                      f"({quarantined} of them)" if quarantined
                      else f"waiting: no live worker of device key {key!r}")
            self._since = now if self._since is None else self._since
            if now - self._since > self.give_up_s:
                raise NoLiveWorker(
                    f"no live worker of device key {key!r} for {self.give_up_s:g} s "
                    f"(TUNEFARM_NO_WORKER_TIMEOUT_S): start one (`tunefarm worker --device-key "
                    f"{key}`), or submit to a key that a worker serves")
        else:
            self._since = None
        self._say(reason)

    def close(self) -> None:
        self._say(None)

    def _say(self, reason: str | None) -> None:
        if reason != self._reported:
            self.report(reason)
            self._reported = reason
