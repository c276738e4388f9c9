"""tuner.queue.streams against a real Redis: at-least-once delivery, leases, dead letters,
recovery after a flush (on a private redis-server)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from tuner.queue import Keys, events, streams

pytestmark = pytest.mark.timeout(60)

GROUP = Keys.WORKERS_GROUP


def _input(trial: str, job: str = "job1") -> dict[str, str]:
    return {"input": json.dumps({"trial_id": trial, "context": {"job_id": job}})}


def test_ensure_group_is_idempotent(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    assert streams.ensure_group(r, stream, GROUP) is True
    assert streams.ensure_group(r, stream, GROUP) is False
    assert r.exists(stream)


def test_group_sees_entries_added_before_it(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    streams.enqueue(r, stream, _input("t0"))
    streams.ensure_group(r, stream, GROUP)
    got = streams.read_new(r, stream, GROUP, "a", count=5)
    assert [json.loads(e.fields["input"])["trial_id"] for e in got] == ["t0"]


def test_read_new_blocks_then_returns_nothing(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    streams.ensure_group(r, stream, GROUP)
    t0 = time.monotonic()
    assert streams.read_new(r, stream, GROUP, "a", block_s=0.2) == []
    assert 0.15 < time.monotonic() - t0 < 2


def test_unacked_entry_is_reclaimed_by_another_consumer_after_the_lease(
        r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    streams.ensure_group(r, stream, GROUP)
    eid = streams.enqueue(r, stream, _input("t1"))
    (first,) = streams.read_new(r, stream, GROUP, "dies", count=1)
    assert first.id == eid and first.deliveries == 1
    # within the lease, nobody else gets it
    assert streams.reclaim(r, stream, GROUP, "janitor", min_idle_s=0.3) == []
    time.sleep(0.35)
    (again,) = streams.reclaim(r, stream, GROUP, "janitor", min_idle_s=0.3)
    assert again.id == eid and again.deliveries == 2
    assert again.fields == first.fields
    assert streams.ack(r, stream, GROUP, eid) == 1
    assert not streams.entry_exists(r, stream, eid)  # acked entries are deleted
    time.sleep(0.35)
    assert streams.reclaim(r, stream, GROUP, "janitor", min_idle_s=0.3) == []


def test_keep_lease_prevents_reclaim(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    streams.ensure_group(r, stream, GROUP)
    eid = streams.enqueue(r, stream, _input("t2"))
    streams.read_new(r, stream, GROUP, "busy")
    for _ in range(4):
        time.sleep(0.15)
        assert streams.keep_lease(r, stream, GROUP, "busy", [eid]) == [eid]
    # 0.6 s since the read, but never idle for 0.3 s
    assert streams.reclaim(r, stream, GROUP, "janitor", min_idle_s=0.3) == []
    assert streams.deliveries(r, stream, GROUP, [eid]) == {eid: 1}  # XCLAIM JUSTID: no delivery
    streams.ack(r, stream, GROUP, eid)
    assert streams.keep_lease(r, stream, GROUP, "busy", [eid]) == []


def test_reclaim_finds_idle_entries_behind_many_live_ones(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    streams.ensure_group(r, stream, GROUP)
    live_ids = [streams.enqueue(r, stream, _input(f"live{i}")) for i in range(25)]
    orphan = streams.enqueue(r, stream, _input("orphan"))
    assert len(streams.read_new(r, stream, GROUP, "live", count=25)) == 25
    streams.read_new(r, stream, GROUP, "dead")
    time.sleep(0.25)
    assert len(streams.keep_lease(r, stream, GROUP, "live", live_ids)) == 25
    (got,) = streams.reclaim(r, stream, GROUP, "janitor", min_idle_s=0.2, count=1)
    assert got.id == orphan and got.deliveries == 2


def test_dead_letter_after_max_deliveries(r: redis.Redis, keys: Keys) -> None:
    stream, max_deliveries = keys.measure("dev"), 3
    streams.ensure_group(r, stream, GROUP)
    eid = streams.enqueue(r, stream, _input("t3", job="jobX"))
    streams.read_new(r, stream, GROUP, "c0")
    seen = [1]
    dead = None
    for i in range(1, 6):
        time.sleep(0.12)
        (e,) = streams.reclaim(r, stream, GROUP, f"c{i}", min_idle_s=0.1)
        seen.append(e.deliveries)
        if e.deliveries > max_deliveries:
            dead = e
            streams.dead_letter(r, keys, "dev", e, reason="killed its worker 3 times")
            break
    assert seen == [1, 2, 3, 4] and dead is not None
    (_d_id, d_fields), = r.xrange(keys.dead("dev"))
    assert d_fields == {"input": dead.fields["input"], "reason": "killed its worker 3 times",
                        "deliveries": "4"}
    (_, lost), = r.xrange(keys.lost("jobX"))
    assert lost == {"trial_id": "t3", "reason": "killed its worker 3 times"}
    assert r.ttl(keys.lost("jobX")) > 0
    assert r.xpending(stream, GROUP)["pending"] == 0
    assert not streams.entry_exists(r, stream, eid)


def test_entry_exists(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dev")
    eid = streams.enqueue(r, stream, _input("t4"))
    assert streams.entry_exists(r, stream, eid)
    assert not streams.entry_exists(r, stream, "1-1")
    assert not streams.entry_exists(r, keys.measure("nothing-here"), "1-1")


def test_events_publish(r: redis.Redis, keys: Keys) -> None:
    eid = events.publish(r, keys, "j1", "progress", {"done": 1, "total": 4})
    assert eid is not None
    (got_id, fields), = r.xrange(keys.events("j1"))
    assert got_id == eid
    assert fields["event"] == "progress" and json.loads(fields["data"]) == {"done": 1, "total": 4}
    assert 0 < r.ttl(keys.events("j1")) <= events.TTL_S


def test_events_publish_survives_redis_down() -> None:
    dead = streams.connect("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    assert events.publish(dead, Keys("x:"), "j", "state", {"state": "running"}) is None


def test_group_is_recreated_after_flushall(private_redis_url: str) -> None:
    r = streams.connect(private_redis_url)
    keys = Keys("t:")
    stream = keys.measure("dev")
    try:
        streams.ensure_group(r, stream, GROUP)
        eid = streams.enqueue(r, stream, _input("t5"))
        streams.read_new(r, stream, GROUP, "a")
        r.flushall()
        # a consumer still holding the entry learns it is gone
        assert streams.keep_lease(r, stream, GROUP, "a", [eid]) == []
        assert streams.ack(r, stream, GROUP, eid) == 0
        # the janitor and the reader re-create the group instead of failing with NOGROUP
        assert streams.reclaim(r, stream, GROUP, "b", min_idle_s=0) == []
        r.flushall()
        assert streams.read_new(r, stream, GROUP, "b") == []
        # an entry re-enqueued after the flush, before any group existed, is delivered
        r.flushall()
        new = streams.enqueue(r, stream, _input("t5"))
        (e,) = streams.read_new(r, stream, GROUP, "b")
        assert e.id == new
    finally:
        r.close()
