"""The one way a tunefarm process says it is still alive: a `Renewer` thread that renews a claim
every period until it is told to stop or the claim is gone.

Three claims use it: a tuner's SQL job lease (`workers.tuner_service`), a worker's leases on the
stream entries it measures, and a worker's heartbeat (`workers.agent`). What they share is the
part that is easy to get wrong: the period counted from the last renewal (not drifting with a
slow renewal), a failed renewal (a database or network hiccup) logged and tried again next
period instead of ending the thread, a claim that is gone (`renew` returns False) ending it, a
stop that is seen within one `tick_s`, and the caller's log context carried into the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Self

from tuner.core import logs

log = logging.getLogger(__name__)


class Renewer:
    """Calls `renew()` every `every_s` seconds on a daemon thread named `name`, from `start()`
    until `stop()` (or `done`, an event of the caller's, is set) or until `renew()` returns
    False (the claim is gone: the caller has done what that means). An exception of a type in
    `retry_on` is logged as "cannot renew `what`" and the renewal tried again one period later.
    `tick()`, when given, runs every `tick_s` in between (watching for a stop request)."""

    def __init__(self, name: str, every_s: float, renew: Callable[[], bool | None], *,
                 what: str, retry_on: tuple[type[BaseException], ...] = (Exception,),
                 tick: Callable[[], None] | None = None, tick_s: float = 0.1,
                 done: threading.Event | None = None) -> None:
        if every_s <= 0:
            raise ValueError(f"a renewal period must be positive, not {every_s}")
        self.every_s, self.renew, self.what = every_s, renew, what
        self.retry_on, self.tick = retry_on, tick
        self.tick_s = tick_s if tick is not None else every_s
        self.done = done or threading.Event()
        self.renewals = 0  # successful calls of `renew` (for tests and logs)
        self._thread = threading.Thread(target=logs.carry(self._run), daemon=True, name=name)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        next_renewal = time.monotonic() + self.every_s
        while True:
            until_renewal = max(0.0, next_renewal - time.monotonic())
            if self.done.wait(min(self.tick_s, until_renewal)):
                return
            if self.tick is not None:
                self.tick()
            if time.monotonic() < next_renewal:
                continue
            next_renewal = time.monotonic() + self.every_s
            try:
                kept = self.renew()
            except self.retry_on as exc:
                log.warning("cannot renew %s (trying again in %g s): %s", self.what,
                            self.every_s, exc)
                continue
            if kept is False:
                return
            self.renewals += 1
