"""API tokens: expiry, revocation (effective on every API process within 1 s), the admin
endpoints /v1/tokens, principal names (reserved ones refused, rotation keeps jobs) and worker
tokens bound to a device key."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import SUBMIT, bearer
from tests.support.apiserver import Server

PG = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
ROOT = Path(__file__).resolve().parents[2]
WORKER = {"name": "w", "target": {"kind": "llvm"}}


def _problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    assert body["code"] == code and body["status"] == status
    return body


# --- tuner.db.tokens -----------------------------------------------------------------------


BAD_NAMES = ["local", "LOCAL", "token-1", "token-0042", "Token-7", "a\nb", "tab\there", "nul\0",
             "\x7f", "bidi\u202eevil", "zero\u200bwidth", " alice", "alice ", "x" * 65]


def test_reserved_and_bad_names_are_refused(store: Any) -> None:
    from tuner.core.errors import SpecError
    from tuner.db.tokens import create_token, list_tokens

    for name in BAD_NAMES:
        with pytest.raises(SpecError) as info:
            create_token(store, "user", name)
        assert info.value.field == "name", name
    assert list_tokens(store) == []


def test_names_that_are_principals(store: Any) -> None:
    from tuner.db.tokens import create_token, verify_token

    for name in ("x" * 64, "token-", "token-1a", "localhost", "tunefarm up", "ünïcode"):
        p = verify_token(store, create_token(store, "user", name))
        assert p is not None and p.owner == name
    unnamed = verify_token(store, create_token(store, "user"))
    assert unnamed is not None and unnamed.owner == f"token-{unnamed.token_id}"


def test_expiry_revocation_and_refusals(store: Any) -> None:
    from tuner.core.errors import NotFound, SpecError
    from tuner.db.tokens import (
        Principal,
        Refusal,
        check_token,
        create_token,
        mint_token,
        revoke_by_name,
        revoke_token,
        verify_token,
    )

    short = create_token(store, "user", "short", expires_in_s=1)
    forever, info = mint_token(store, "user", "forever", expires_in_s=None)
    assert info.expires_at is None and info.state == "active"
    default = mint_token(store, "user", "default")[1]
    assert default.expires_at is not None
    days = (default.expires_at - default.created_at).total_seconds() / 86400
    assert 89.9 < days < 90.1
    assert isinstance(check_token(store, short), Principal)
    time.sleep(1.1)
    assert check_token(store, short) is Refusal.EXPIRED and verify_token(store, short) is None
    assert isinstance(check_token(store, forever), Principal)
    assert check_token(store, "tf_guessed") is Refusal.INVALID
    assert revoke_token(store, info.id).state == "revoked"
    first = revoke_token(store, info.id).revoked_at  # idempotent: keeps the first time
    assert revoke_token(store, info.id).revoked_at == first
    assert check_token(store, forever) is Refusal.REVOKED
    for bad in (0, -1, 2**40, 999_999):
        with pytest.raises(NotFound):
            revoke_token(store, bad)
    for bad_s in (0, -5, float("inf"), float("nan"), 20 * 365 * 86400, True, "90"):
        with pytest.raises(SpecError):
            create_token(store, "user", "x", expires_in_s=bad_s)
    a1, a2 = (create_token(store, "user", "alice") for _ in range(2))
    assert {t.name for t in revoke_by_name(store, "alice")} == {"alice"}
    assert verify_token(store, a1) is None and verify_token(store, a2) is None
    with pytest.raises(NotFound):
        revoke_by_name(store, "alice")  # none unrevoked left
    with pytest.raises(SpecError):
        revoke_by_name(store, "")


def test_device_keys_bind_worker_tokens_only(store: Any) -> None:
    from tuner.core.errors import SpecError
    from tuner.db.tokens import create_token, verify_token

    p = verify_token(store, create_token(store, "worker", "rack", device_key="zen5"))
    assert p is not None and p.device_key == "zen5"
    for scope, key in (("user", "zen5"), ("admin", "zen5"), ("worker", "-x"),
                       ("worker", "a b"), ("worker", "k" * 65), ("worker", "")):
        with pytest.raises(SpecError) as info:
            create_token(store, scope, "rack", device_key=key)
        assert info.value.field == "device_key"


def test_parse_lifetime() -> None:
    from tuner.core.errors import SpecError
    from tuner.db.tokens import parse_lifetime

    assert parse_lifetime("90d") == 90 * 86400 and parse_lifetime("12h") == 12 * 3600
    assert parse_lifetime("30m") == 1800 and parse_lifetime("45s") == 45
    assert parse_lifetime("3600") == 3600 and parse_lifetime(" Never ") is None
    for bad in ("", "0d", "-1d", "1w", "1.5h", "d", "9" * 30, "3651d", "1 d"):
        with pytest.raises(SpecError):
            parse_lifetime(bad)


# --- /v1/tokens ----------------------------------------------------------------------------


@PG
def test_admin_creates_lists_and_revokes(client: Any, admin: dict[str, str]) -> None:
    resp = client.post("/v1/tokens", headers=admin,
                       json={"scope": "user", "name": "carol", "expires_in_s": 3600})
    assert resp.status_code == 201, resp.text
    made = resp.json()
    tok = made["token"]
    assert tok.startswith("tf_") and made["state"] == "active" and made["name"] == "carol"
    assert client.get("/v1/jobs", headers=bearer(tok)).status_code == 200

    listed = client.get("/v1/tokens", headers=admin)
    assert listed.status_code == 200
    assert tok not in listed.text and "hash" not in listed.text
    row = next(t for t in listed.json() if t["id"] == made["id"])
    assert "token" not in row and row["scope"] == "user" and row["expires_at"]

    assert client.delete(f"/v1/tokens/{made['id']}", headers=admin).status_code == 204
    # this process forgets it at once (others within token_cache_s)
    body = _problem(client.get("/v1/jobs", headers=bearer(tok)), 401, "unauthorized")
    assert "revoked" in body["detail"]
    assert client.delete(f"/v1/tokens/{made['id']}", headers=admin).status_code == 204
    row = next(t for t in client.get("/v1/tokens", headers=admin).json()
               if t["id"] == made["id"])
    assert row["state"] == "revoked" and row["revoked_at"]
    _problem(client.delete("/v1/tokens/999999", headers=admin), 404, "not_found")
    for bad in ("0", "-1", "abc", str(2**40)):
        _problem(client.delete(f"/v1/tokens/{bad}", headers=admin), 422, "validation_error")


@PG
def test_token_endpoints_are_for_admins(client: Any, user: dict[str, str],
                                        worker: dict[str, str]) -> None:
    calls = [("POST", "/v1/tokens", {"scope": "admin", "name": "me"}), ("GET", "/v1/tokens", None),
             ("DELETE", "/v1/tokens/1", None)]
    for method, path, body in calls:
        for headers in (user, worker):
            _problem(client.request(method, path, headers=headers, json=body), 403, "forbidden")
        _problem(client.request(method, path, json=body), 401, "unauthorized")


BAD_BODIES: list[tuple[Any, int, str]] = [
    ({"scope": "user", "name": "n", "extra": 1}, 422, "validation_error"),
    ({"name": "n"}, 422, "validation_error"),
    ({"scope": "root", "name": "n"}, 422, "validation_error"),
    ({"scope": "user"}, 422, "validation_error"),
    ({"scope": "user", "name": ""}, 422, "validation_error"),
    ({"scope": "user", "name": 5}, 422, "validation_error"),
    ({"scope": "user", "name": "x" * 65}, 422, "validation_error"),
    ({"scope": "user", "name": "local"}, 422, "invalid_spec"),
    ({"scope": "user", "name": "token-3"}, 422, "invalid_spec"),
    ({"scope": "user", "name": "a\u0000b"}, 422, "invalid_spec"),
    ({"scope": "user", "name": "n", "expires_in_s": 0}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "expires_in_s": -1}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "expires_in_s": "90"}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "expires_in_s": 1.5}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "expires_in_s": True}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "expires_in_s": 10**30}, 422, "validation_error"),
    ({"scope": "user", "name": "n", "device_key": "zen5"}, 422, "invalid_spec"),
    ({"scope": "worker", "name": "n", "device_key": "a b"}, 422, "validation_error"),
    ([], 422, "validation_error"),
    ("not json", 400, "malformed_json"),
]


@PG
@pytest.mark.parametrize(("body", "status", "code"), BAD_BODIES)
def test_bad_create_bodies_are_clear_problems(client: Any, admin: dict[str, str], body: Any,
                                              status: int, code: str) -> None:
    if isinstance(body, str):
        resp = client.post("/v1/tokens", content=body,
                           headers={**admin, "Content-Type": "application/json"})
    else:
        resp = client.post("/v1/tokens", json=body, headers=admin)
    _problem(resp, status, code)


@PG
def test_expired_token_is_401_saying_so(client: Any, ctx: Any) -> None:
    from tuner.db.tokens import create_token

    tok = create_token(ctx.store, "user", "brief", expires_in_s=1)
    assert client.get("/v1/jobs", headers=bearer(tok)).status_code == 200  # cached now
    time.sleep(1.1)
    body = _problem(client.get("/v1/jobs", headers=bearer(tok)), 401, "unauthorized")
    assert "expired" in body["detail"]
    ctx.tokens.clear()  # and from the database, not only the cached principal's expiry
    body = _problem(client.get("/v1/jobs", headers=bearer(tok)), 401, "unauthorized")
    assert "expired" in body["detail"]
    # a guessed token learns nothing: neither expired nor revoked
    guess = _problem(client.get("/v1/jobs", headers=bearer("tf_" + "x" * 43)), 401,
                     "unauthorized")
    assert guess["detail"] == "invalid token"


@PG
def test_rotation_under_one_name_keeps_the_jobs(client: Any, ctx: Any, admin: dict[str, str],
                                                submit: Callable[..., dict[str, Any]]) -> None:
    from tuner.db.tokens import create_token

    old = bearer(create_token(ctx.store, "user", "dana"))
    job = submit(old, SUBMIT)
    new = client.post("/v1/tokens", headers=admin, json={"scope": "user", "name": "dana"})
    assert new.status_code == 201
    old_id = next(t["id"] for t in client.get("/v1/tokens", headers=admin).json()
                  if t["name"] == "dana" and t["id"] != new.json()["id"])
    assert client.delete(f"/v1/tokens/{old_id}", headers=admin).status_code == 204
    assert client.get("/v1/jobs", headers=old).status_code == 401
    fresh = bearer(new.json()["token"])
    assert client.get(f"/v1/jobs/{job['id']}", headers=fresh).status_code == 200
    other = bearer(create_token(ctx.store, "user", "eve"))
    assert client.get(f"/v1/jobs/{job['id']}", headers=other).status_code == 404


@PG
def test_bound_worker_token_registers_its_device_key_only(client: Any, ctx: Any,
                                                          worker: dict[str, str]) -> None:
    from tuner.db.tokens import create_token

    bound = bearer(create_token(ctx.store, "worker", "rack-zen5", device_key="zen5"))
    ok = client.post("/v1/workers", headers=bound, json={**WORKER, "device_key": "zen5"})
    assert ok.status_code == 201, ok.text
    for key in ("local", "zen4", "ZEN5"):
        body = _problem(client.post("/v1/workers", headers=bound,
                                    json={**WORKER, "device_key": key}), 403, "forbidden")
        assert repr(key) in body["detail"] and "'zen5'" in body["detail"]
    # without device_key a registration is for "local": refused too
    _problem(client.post("/v1/workers", headers=bound, json=WORKER), 403, "forbidden")
    assert client.post("/v1/workers", headers=worker,  # an unbound worker token: any key
                       json={**WORKER, "device_key": "zen4"}).status_code == 201


# --- two real API processes ----------------------------------------------------------------


@pytest.fixture
def two_apis(store: Any, redis_url: str, redis_prefix: str,
             tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    env = {**os.environ, "TUNEFARM_DATABASE_URL": store.url, "TUNEFARM_REDIS_URL": redis_url,
           "TUNEFARM_REDIS_PREFIX": redis_prefix, "TUNEFARM_DATA_DIR": str(tmp_path / "data")}
    env.pop("TUNEFARM_TOKEN_CACHE_S", None)  # the default is what is tested
    servers: list[Server] = []
    try:
        for i in range(2):  # started together: each takes seconds to import TVM
            servers.append(Server(env, tmp_path / f"api{i}.log"))
        for s in servers:
            s.wait_ready()
        yield servers[0], servers[1]
    finally:
        for s in servers:
            s.stop()


@PG
@pytest.mark.timeout(240)
def test_revocation_reaches_every_api_process_within_a_second(
        store: Any, two_apis: tuple[Server, Server]) -> None:
    from tuner.db.tokens import create_token, verify_token

    a, b = two_apis
    tok = create_token(store, "user", "frank")
    admin = bearer(create_token(store, "admin", "ops"))
    principal = verify_token(store, tok)
    assert principal is not None
    with httpx.Client(timeout=5) as http:
        def status(s: Server) -> int:
            return http.get(f"{s.url}/v1/jobs", headers=bearer(tok)).status_code

        for _ in range(3):  # both processes hold the principal in their caches now
            assert status(a) == 200 and status(b) == 200
        t0 = time.perf_counter()
        resp = http.delete(f"{a.url}/v1/tokens/{principal.token_id}", headers=admin)
        assert resp.status_code == 204
        delays: dict[str, float] = {}
        while len(delays) < 2 and time.perf_counter() - t0 < 5.0:
            for label, s in (("a", a), ("b", b)):
                if label not in delays and status(s) == 401:
                    delays[label] = time.perf_counter() - t0
            time.sleep(0.02)
        print(f"revocation -> first 401: {delays}")
        assert set(delays) == {"a", "b"}, delays
        assert max(delays.values()) <= 1.5, delays
        for s in (a, b):  # and it stays refused, saying why
            resp = http.get(f"{s.url}/v1/jobs", headers=bearer(tok))
            assert resp.status_code == 401 and "revoked" in resp.json()["detail"]
