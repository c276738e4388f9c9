"""GET /v1/jobs/{id}/events: server-sent events from the job's Redis stream."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
Event = tuple[str | None, str, dict[str, Any]]


def _events(lines: Iterator[str], comments: list[str] | None = None) -> Iterator[Event]:
    eid, etype, data = None, "message", []
    for line in lines:
        if line == "":
            if data:
                yield eid, etype, json.loads("\n".join(data))
            eid, etype, data = None, "message", []
        elif line.startswith(":"):
            if comments is not None:
                comments.append(line)
        else:
            name, _, value = line.partition(": ")
            if name == "id":
                eid = value
            elif name == "event":
                etype = value
            elif name == "data":
                data.append(value)


def _publish(redis_client: Any, ctx: Any, job_id: str, etype: str, data: dict[str, Any]
             ) -> str:
    from tuner.queue import events

    eid = events.publish(redis_client, ctx.keys, job_id, etype, data)
    assert eid is not None
    return eid


def _progress(done: int) -> dict[str, Any]:
    return {"done": done, "total": 16, "best_s": 1e-3, "best_gflops": 4.2, "last": None}


def test_replay_live_events_and_reconnect(client: Any, ctx: Any, user: dict[str, str],
                                          redis_client: Any,
                                          submit: Callable[..., dict[str, Any]]) -> None:
    job = submit(user)
    jid = job["id"]
    _publish(redis_client, ctx, jid, "state", {"state": "RUNNING"})
    _publish(redis_client, ctx, jid, "progress", _progress(1))
    url = f"/v1/jobs/{jid}/events"
    got: list[Event] = []
    with client.stream("GET", url, headers=user) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        stream = _events(resp.iter_lines())
        got += [next(stream) for _ in range(3)]  # the backlog: QUEUED, RUNNING, progress 1
        _publish(redis_client, ctx, jid, "progress", _progress(2))  # live
        got.append(next(stream))
    # disconnected: these happen while nobody listens
    _publish(redis_client, ctx, jid, "record", {"trial_id": "t", "invalidity": "ok",
                                                "latency_s": 1e-3})
    _publish(redis_client, ctx, jid, "state", {"state": "SUCCEEDED"})
    _publish(redis_client, ctx, jid, "progress", _progress(99))  # after the end: never sent
    with client.stream("GET", url, headers={**user, "Last-Event-ID": got[-1][0]}) as resp:
        rest = list(_events(resp.iter_lines()))  # ends by itself after SUCCEEDED
    everything = got + rest
    kinds = [(t, d.get("state", d.get("done", d.get("trial_id")))) for _, t, d in everything]
    assert kinds == [("state", "QUEUED"), ("state", "RUNNING"), ("progress", 1),
                     ("progress", 2), ("record", "t"), ("state", "SUCCEEDED")]
    ids = [e[0] for e in everything]
    assert all(ids) and len(set(ids)) == len(ids)
    assert ids == [eid for eid, _ in redis_client.xrange(ctx.keys.events(jid))][:6]
    # the query parameter works like the header
    with client.stream("GET", url, params={"after": ids[3]}, headers=user) as resp:
        assert [e[0] for e in _events(resp.iter_lines())] == ids[4:]


def test_stream_ends_from_sql_when_redis_lost_the_events(
        client: Any, ctx: Any, user: dict[str, str], redis_client: Any,
        submit: Callable[..., dict[str, Any]]) -> None:
    job = submit(user)
    ctx.store.set_job_state(job["id"], "RUNNING")
    ctx.store.set_job_state(job["id"], "FAILED", error="no worker")
    redis_client.delete(ctx.keys.events(job["id"]))  # e.g. FLUSHALL
    start = time.monotonic()
    with client.stream("GET", f"/v1/jobs/{job['id']}/events", headers=user) as resp:
        events = list(_events(resp.iter_lines()))
    assert [(t, d) for _, t, d in events] == [("state", {"state": "FAILED", "error": "no worker"})]
    assert time.monotonic() - start < 10


def test_cancel_ends_a_waiting_stream(client: Any, ctx: Any, user: dict[str, str],
                                      submit: Callable[..., dict[str, Any]],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import api.events

    monkeypatch.setattr(api.events, "KEEPALIVE_S", 0.2)
    monkeypatch.setattr(api.events, "BLOCK_MS", 100)
    job = submit(user)
    comments: list[str] = []
    with client.stream("GET", f"/v1/jobs/{job['id']}/events", headers=user) as resp:
        stream = _events(resp.iter_lines(), comments)
        assert next(stream)[2] == {"state": "QUEUED"}
        time.sleep(0.8)  # the stream idles: keep-alive comments are sent meanwhile
        assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=user).status_code == 202
        rest = list(stream)
    assert [d["state"] for _, t, d in rest if t == "state"] == ["CANCELLED"]
    assert comments and comments[0].startswith(": keep-alive")


@pytest.mark.parametrize("event_id", [
    "not-an-id", "1-", "-1", "1-2-3", "18446744073709551616-0", "0-18446744073709551616",
    "99999999999999999999-1", "١٢-٣", "1" * 200,
])
def test_bad_last_event_id(client: Any, user: dict[str, str],
                           submit: Callable[..., dict[str, Any]], event_id: str) -> None:
    """Not `<ms>-<seq>`, a part at or above 2**64, non-ASCII digits, far too long: 400
    `bad_event_id` (as a header and as `?after=`)."""
    job = submit(user)
    url = f"/v1/jobs/{job['id']}/events"
    resp = client.get(url, headers={**user, "Last-Event-ID": event_id.encode()})
    assert resp.status_code == 400 and resp.json()["code"] == "bad_event_id"
    assert resp.headers["content-type"] == "application/problem+json"
    resp = client.get(url, params={"after": event_id}, headers=user)
    assert resp.status_code == 400 and resp.json()["code"] == "bad_event_id"


def test_only_the_owner_and_admins_follow_a_job(client: Any, ctx: Any, user: dict[str, str],
                                                admin: dict[str, str], redis_client: Any,
                                                submit: Callable[..., dict[str, Any]]) -> None:
    from tests.api.conftest import bearer
    from tuner.db.tokens import create_token

    job = submit(bearer(create_token(ctx.store, "user", name="alice")))
    _publish(redis_client, ctx, job["id"], "state", {"state": "CANCELLED"})
    url = f"/v1/jobs/{job['id']}/events"
    other = client.get(url, headers=user)  # another user: as if the job did not exist
    assert other.status_code == 404 and other.json()["code"] == "not_found"
    assert "text/event-stream" not in other.headers["content-type"]
    with client.stream("GET", url, headers=admin) as resp:
        assert resp.status_code == 200
        states = [d["state"] for _, t, d in _events(resp.iter_lines()) if t == "state"]
    assert states == ["QUEUED", "CANCELLED"]
