"""tuner.queue.cancel: the Redis cancel flag workers read, set by the API and the tuner."""

from __future__ import annotations

import pytest
import redis

from tuner.queue import CANCELLED_TTL_S, Keys, is_cancelled, mark_cancelled

pytestmark = pytest.mark.timeout(60)


def test_flag_is_set_with_its_ttl(r: redis.Redis, keys: Keys) -> None:
    assert not is_cancelled(r, keys, "job1")
    assert mark_cancelled(r, keys, "job1") is True
    assert is_cancelled(r, keys, "job1") and not is_cancelled(r, keys, "job2")
    assert r.get(keys.cancelled("job1")) == "1"
    assert 0 < r.ttl(keys.cancelled("job1")) <= CANCELLED_TTL_S
    assert mark_cancelled(r, keys, "job1") is True  # idempotent


def test_setting_never_fails_the_caller() -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert mark_cancelled(dead, Keys("x:"), "job1") is False  # logged, not raised
    with pytest.raises(redis.ConnectionError):
        is_cancelled(dead, Keys("x:"), "job1")
