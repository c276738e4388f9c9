"""HTTP hygiene: the request body limit (by Content-Length and while a chunked body is read, in
process and over a real uvicorn socket), the metrics token, and the SQL behind /readyz and
/metrics (`tuner.db.stats`)."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.api.conftest import SUBMIT

PROBLEM = "application/problem+json"
MB = 1 << 20
BIG = 26 * MB  # far over the default limit of 1 MiB
pg = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _jobs(ctx: Any) -> list[Any]:
    from tuner.db import jobs as jobs_db

    return jobs_db.list_jobs(ctx.store, limit=500)[0]


@pytest.fixture
def json_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many request bodies the app parsed as JSON (one entry per `Request.json()`)."""
    from starlette.requests import Request

    calls: list[int] = []
    real = Request.json

    async def counting(self: Request) -> Any:
        calls.append(1)
        return await real(self)

    monkeypatch.setattr(Request, "json", counting)
    return calls


def _assert_too_large(status: int, headers: Any, body: bytes) -> None:
    assert status == 413, body[:300]
    assert headers["content-type"] == PROBLEM
    problem = json.loads(body)
    assert problem["code"] == "payload_too_large" and problem["status"] == 413
    assert problem["detail"] and problem["limit"] == MB


def _padded(size: int) -> bytes:
    """A valid job request of exactly `size` bytes (JSON whitespace after the object)."""
    text = json.dumps(SUBMIT).encode()
    return text + b" " * (size - len(text))


@pg
def test_a_26_mb_body_is_refused_by_its_length(client: Any, ctx: Any, user: dict[str, str],
                                               json_reads: list[int]) -> None:
    resp = client.post("/v1/jobs", content=_padded(BIG),
                       headers={**user, "Content-Type": "application/json"})
    _assert_too_large(resp.status_code, resp.headers, resp.content)
    assert json_reads == [] and _jobs(ctx) == []


@pg
def test_a_chunked_body_over_the_limit_is_refused_while_read(
        client: Any, ctx: Any, user: dict[str, str], json_reads: list[int]) -> None:
    def chunks() -> Iterator[bytes]:
        body = _padded(2 * MB)
        for i in range(0, len(body), 64 * 1024):
            yield body[i:i + 64 * 1024]

    resp = client.post("/v1/jobs", content=chunks(),
                       headers={**user, "Content-Type": "application/json"})
    assert "content-length" not in resp.request.headers  # sent chunked: counted while read
    _assert_too_large(resp.status_code, resp.headers, resp.content)
    assert json_reads == [] and _jobs(ctx) == []


@pg
def test_a_body_at_the_limit_is_accepted(client: Any, ctx: Any, user: dict[str, str]) -> None:
    resp = client.post("/v1/jobs", content=_padded(MB),
                       headers={**user, "Content-Type": "application/json"})
    assert resp.status_code == 202, resp.text
    assert len(_jobs(ctx)) == 1


def _raw(base_url: str, head: bytes, chunks: Iterable[bytes] = ()) -> tuple[int, dict[str, str],
                                                                               bytes, int]:
    """One HTTP/1.1 exchange on a plain socket: send `head`, then `chunks` until the server
    answers; returns (status, headers, body, bytes of the body sent)."""
    parts = urlsplit(base_url)
    sent = 0
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=20) as sock:
        sock.sendall(head)
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is there: stop sending
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed after answering
                break
            sent += len(chunk)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected_len(data):
            part = sock.recv(65536)
            if not part:
                break
            data += part
    head_text, _, body = data.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body, sent


def _expected_len(data: bytes) -> int:
    head, sep, _ = data.partition(b"\r\n\r\n")
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return len(head) + len(sep) + int(value)
    return len(data) + 1


def _head(path: str, token: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


@pg
def test_over_a_real_socket(live_server: tuple[str, Any], tokens: dict[str, str]) -> None:
    """Under uvicorn: a Content-Length over the limit is answered before one byte of the body
    is sent; a chunked body is cut off soon after it crosses the limit."""
    base_url, app = live_server
    status, headers, body, _ = _raw(base_url, _head("/v1/jobs", tokens["user"],
                                                    f"Content-Length: {BIG}\r\n"))
    _assert_too_large(status, headers, body)

    payload = _padded(BIG)

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(payload), 64 * 1024):
            piece = payload[i:i + 64 * 1024]
            yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        yield b"0\r\n\r\n"

    status, headers, body, sent = _raw(
        base_url, _head("/v1/jobs", tokens["user"], "Transfer-Encoding: chunked\r\n"), chunked())
    _assert_too_large(status, headers, body)
    assert sent < 8 * MB  # refused long before the 26 MB were sent
    assert _jobs(app.state.ctx) == []


@pg
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_json_never_reaches_a_server_error(client: Any, ctx: Any,
                                                      tokens: dict[str, str],
                                                      literal: str) -> None:
    """Every POST of the API, as an admin, with NaN / Infinity in a body: a 4xx problem."""
    import re

    doc = client.get("/v1/openapi.json").json()
    posts = [re.sub(r"{\w+}", "w", p) for p, ops in doc["paths"].items() if "post" in ops]
    assert "/v1/jobs" in posts and len(posts) >= 5
    bodies = [f'{{"x": {literal}}}', json.dumps(SUBMIT)[:-1] + f', "wall_budget_s": {literal}}}',
              f'{{"workload": {{"op": "matmul", "shape": [{literal}, 1, 1]}}}}']
    for path in posts:
        for body in bodies:
            resp = client.post(path, content=body, headers={
                "Authorization": f"Bearer {tokens['admin']}", "Content-Type": "application/json"})
            assert 400 <= resp.status_code < 500, (path, body, resp.text)
            assert resp.headers["content-type"] == PROBLEM
    assert _jobs(ctx) == []


# --- /metrics --------------------------------------------------------------------------------


@pytest.fixture
def guarded(api_settings: Any) -> Iterator[Any]:
    """An app whose /metrics needs the metrics token "m3trics-s3cret"."""
    from fastapi.testclient import TestClient

    from api.app import create_app

    settings = api_settings.model_copy(update={"metrics_token": "m3trics-s3cret"})
    with TestClient(create_app(settings)) as c:
        yield c


@pg
@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer wrong", "Basic m3trics-s3cret", "Bearer m3trics-s3cre",
    "Bearer m3trics-s3cret-and-more", "Bearer m3trics-s3cretü",
])
def test_metrics_need_the_metrics_token_when_set(guarded: Any, tokens: dict[str, str],
                                                 authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization.encode()}
    resp = guarded.get("/metrics", headers=headers)
    assert resp.status_code == 401, resp.text
    assert resp.headers["content-type"] == PROBLEM and resp.json()["code"] == "unauthorized"
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert "m3trics" not in resp.text and "tunefarm_jobs" not in resp.text


@pg
def test_metrics_answer_with_the_metrics_token(guarded: Any, tokens: dict[str, str]) -> None:
    ok = guarded.get("/metrics", headers={"Authorization": "Bearer m3trics-s3cret"})
    assert ok.status_code == 200 and 'tunefarm_jobs{state="QUEUED"} 0.0' in ok.text
    admin = guarded.get("/metrics", headers={"Authorization": f"Bearer {tokens['admin']}"})
    assert admin.status_code == 401  # an API token is not the metrics token
    assert guarded.get("/healthz").status_code == 200  # health stays open
    assert guarded.get("/readyz").status_code == 200


@pg
def test_metrics_are_open_without_a_metrics_token(client: Any) -> None:
    resp = client.get("/metrics")
    assert resp.status_code == 200 and "tunefarm_records 0.0" in resp.text
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 200


# --- health models and tuner.db.stats ----------------------------------------------------------


@pg
def test_health_answers_are_documented_models(client: Any) -> None:
    doc = client.get("/v1/openapi.json").json()
    for path in ("/healthz", "/readyz"):
        ok = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert ok["schema"] == {"$ref": "#/components/schemas/Health"}
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok",
                                            "checks": {"sql": "ok", "redis": "ok"}}


def test_stats_counts_and_ping(store: Any) -> None:
    from tuner.db import stats
    from tuner.db.tables import JobState

    stats.ping(store)
    counts = stats.counts(store)
    assert counts.records == 0
    assert counts.jobs_by_state == {s.value: 0 for s in JobState}


def test_the_largest_event_id_is_accepted() -> None:
    from api.events import parse_last_event_id

    top = f"{(1 << 64) - 1}-{(1 << 64) - 1}"
    assert parse_last_event_id(top) == top
    assert parse_last_event_id(" 0-1 ") == "0-1" and parse_last_event_id("") == "0-0"
