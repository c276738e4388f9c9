"""The one renewer (`tuner.core.liveness.Renewer`) behind a tuner's job lease, a worker's entry
leases and its heartbeat: pure thread logic, with short real periods."""

from __future__ import annotations

import logging
import threading
import time
from itertools import pairwise

import pytest

from tuner.core.liveness import Renewer


def _wait_for(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_it_renews_every_period_until_stopped() -> None:
    calls: list[float] = []
    with Renewer("t", 0.05, lambda: calls.append(time.monotonic()) and None, what="x") as r:
        _wait_for(lambda: len(calls) >= 4)
    n = len(calls)
    time.sleep(0.15)
    assert len(calls) == n, "renewed after stop()"
    gaps = [b - a for a, b in pairwise(calls)]
    assert all(0.04 <= g < 0.5 for g in gaps), gaps
    assert r.renewals == n


def test_a_failed_renewal_is_logged_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[int] = []

    def renew() -> None:
        attempts.append(1)
        if len(attempts) <= 2:
            raise ConnectionError("database restarting")

    with caplog.at_level(logging.WARNING, "tuner.core.liveness"), \
            Renewer("t", 0.03, renew, what="the lease of job j") as r:
        _wait_for(lambda: r.renewals >= 2)
    assert len(attempts) >= 4
    warned = [rec.getMessage() for rec in caplog.records]
    assert len(warned) == 2 and all("cannot renew the lease of job j" in w for w in warned)
    assert "database restarting" in warned[0]


def test_an_error_it_is_not_told_to_retry_ends_the_thread_loudly() -> None:
    class Boom(Exception):
        pass

    def renew() -> None:
        raise Boom("bug")

    seen: list[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)  # type: ignore[assignment]
    try:
        r = Renewer("t", 0.02, renew, what="x", retry_on=(ConnectionError,)).start()
        _wait_for(lambda: bool(seen))
        r.stop()
    finally:
        threading.excepthook = old
    assert isinstance(seen[0], Boom)


def test_a_claim_that_is_gone_ends_the_renewals() -> None:
    calls: list[int] = []

    def renew() -> bool:
        calls.append(1)
        return len(calls) < 3  # the third renewal finds the claim gone

    r = Renewer("t", 0.02, renew, what="x").start()
    _wait_for(lambda: not r._thread.is_alive())
    assert len(calls) == 3 and r.renewals == 2
    r.stop()


def test_tick_runs_between_renewals_and_the_callers_event_stops_it() -> None:
    done = threading.Event()
    ticks: list[int] = []
    renewals: list[int] = []
    r = Renewer("t", 0.2, lambda: renewals.append(1) and None, what="x",
                tick=lambda: ticks.append(1), tick_s=0.01, done=done).start()
    _wait_for(lambda: len(ticks) >= 10)
    assert len(renewals) <= 1  # ten ticks in well under two periods
    done.set()
    _wait_for(lambda: not r._thread.is_alive(), timeout=1.0)


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Renewer("t", 0, lambda: None, what="x")
