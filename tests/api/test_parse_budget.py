"""TVMScript parse children are the API's costliest work, so nothing reaches one before the
quotas, and every one runs inside the parse gate (`api.parsegate`): a few at once per process,
a bounded queue, and a per-principal budget of new texts a minute. Workers never make the API
parse (GET /v1/best by key). Real parse children, real PostgreSQL and Redis."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer
from tests.kernels import HEADER

pytestmark = [pytest.mark.parametrize("db_url", ["postgresql"], indirect=True),
              pytest.mark.timeout(300)]
PROBLEM = "application/problem+json"


def relu(cols: int) -> str:
    """A distinct small PrimFunc per `cols` (a new text: a parse child unless cached)."""
    return HEADER + (
        f'def main(A: T.Buffer((16, {cols}), "float32"), B: T.Buffer((16, {cols}), "float32")):\n'
        '    T.func_attr({"global_symbol": "main", "tirx.noalias": True})\n'
        f'    for i, j in T.grid(16, {cols}):\n'
        '        with T.sblock("B"):\n'
        '            vi, vj = T.axis.remap("SS", [i, j])\n'
        '            B[vi, vj] = T.max(A[vi, vj], T.float32(0))\n')


def tir(cols: int) -> dict[str, Any]:
    return {"op": "tir", "tvmscript": relu(cols)}


App = Callable[..., AbstractContextManager[tuple[Any, dict[str, str], dict[str, str],
                                                 dict[str, str]]]]


@pytest.fixture
def app(api_settings: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[App, list[int]]:
    """app(**settings) -> (client, alice, bob, a worker's headers), and the list of texts each
    parse child was started for (appended as children start)."""
    from tuner.workloads import isolate

    started: list[int] = []
    real = isolate._parse_in_child

    def spy(texts: list[str]) -> Any:
        started.append(len(texts))
        return real(texts)

    monkeypatch.setattr(isolate, "_parse_in_child", spy)
    isolate.clear_cache()

    @contextmanager
    def run(**over: Any) -> Iterator[tuple[Any, dict[str, str], dict[str, str], dict[str, str]]]:
        from fastapi.testclient import TestClient

        from api.app import create_app
        from tuner.db.tokens import create_token

        with TestClient(create_app(api_settings.model_copy(update=over))) as c:
            store = c.app.state.ctx.store  # type: ignore[attr-defined]
            yield (c, bearer(create_token(store, "user", name="alice")),
                   bearer(create_token(store, "user", name="bob")),
                   bearer(create_token(store, "worker", name="w")))

    return run, started


def _problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    assert body["code"] == code, body
    return body


def test_an_over_quota_model_is_a_429_before_any_parse(app: tuple[App, list[int]]) -> None:
    run, started = app
    with run(max_queued_jobs=1) as (c, alice, _bob, _w):
        assert c.post("/v1/jobs", json=SUBMIT, headers=alice).status_code == 202
        tasks = [{"name": f"relu{i}", "tvmscript": relu(8 + i)} for i in range(40)]
        t0 = time.perf_counter()
        resp = c.post("/v1/models", json={"name": "m", "tasks": tasks}, headers=alice)
        took = time.perf_counter() - t0
        _problem(resp, 429, "quota_exceeded")
        assert int(resp.headers["retry-after"]) >= 1
        assert took < 0.1, f"{took:.3f} s"
        # a single tir job over the quota: refused before its parse too
        over = c.post("/v1/jobs", json={"workload": tir(7), "trials": 4}, headers=alice)
        _problem(over, 429, "quota_exceeded")
        assert started == []  # no parse child was started


def test_a_worker_asks_by_key_and_never_makes_the_api_parse(app: tuple[App, list[int]]) -> None:
    run, started = app
    with run() as (c, alice, _bob, worker):
        query = {"workload": json.dumps(tir(24))}
        _problem(c.get("/v1/best", params=query, headers=worker), 403, "forbidden")
        assert started == []
        _problem(c.get("/v1/best", params=query, headers=alice), 404, "not_found")
        assert started == [1]  # a user's query is parsed (inside the gate and its budget)
        # now known to this API: the worker's query is answered without a child
        _problem(c.get("/v1/best", params=query, headers=worker), 404, "not_found")
        assert started == [1]


def test_each_principal_has_a_parse_budget(app: tuple[App, list[int]]) -> None:
    run, started = app
    with run(parse_per_min=2) as (c, alice, bob, _w):
        for cols in (9, 10):
            assert c.post("/v1/jobs", json={"workload": tir(cols), "trials": 4},
                          headers=alice).status_code == 202
        over = c.post("/v1/jobs", json={"workload": tir(11), "trials": 4}, headers=alice)
        assert "parse budget" in _problem(over, 429, "parse_budget")["detail"]
        assert int(over.headers["retry-after"]) >= 1
        # a text already parsed costs nothing; another principal has a budget of its own
        assert c.post("/v1/jobs", json={"workload": tir(9), "trials": 4},
                      headers=alice).status_code == 202
        assert c.post("/v1/jobs", json={"workload": tir(11), "trials": 4},
                      headers=bob).status_code == 202
        assert len(started) == 3
        # a model whose new tasks pass the budget at once is refused whole
        tasks = [{"name": f"t{i}", "tvmscript": relu(40 + i)} for i in range(3)]
        _problem(c.post("/v1/models", json={"name": "m", "tasks": tasks}, headers=bob),
                 429, "parse_budget")
        assert len(started) == 3


P99_BOUND_S = 0.05  # the goal
PROBE = """
import json, sys, threading, time
import httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
took = []
with httpx.Client(base_url=sys.argv[1], timeout=10) as h:
    while not stop.is_set():
        t0 = time.perf_counter()
        assert h.get("/healthz").status_code == 200
        took.append((t0, time.perf_counter() - t0))
        time.sleep(0.003)
print(json.dumps(took))
"""


@pytest.mark.solo  # a latency bound: not while another test loads the other core
def test_a_flood_of_tvmscript_keeps_the_api_responsive(store: Any, redis_url: str,
                                                       redis_prefix: str, tmp_path: Any) -> None:
    """100 distinct `tir` specs from one user at once against a real API process: a few are
    parsed, the rest answered 429 at once; /healthz stays fast throughout and another user's
    submission goes through."""
    import os

    import httpx

    from tests.support.apiserver import Server
    from tuner.db.tokens import create_token

    env = {**os.environ, "TUNEFARM_DATABASE_URL": store.url, "TUNEFARM_REDIS_URL": redis_url,
           "TUNEFARM_REDIS_PREFIX": redis_prefix, "TUNEFARM_DATA_DIR": str(tmp_path / "data"),
           "TUNEFARM_PARSE_SLOTS": "2", "TUNEFARM_PARSE_QUEUE": "4",
           "TUNEFARM_PARSE_WAIT_S": "5"}
    server = Server(env, tmp_path / "api.log")
    try:
        server.wait_ready()
        alice = bearer(create_token(store, "user", name="alice"))
        bob = bearer(create_token(store, "user", name="bob"))
        # the prober is a process of its own: the flood's client threads share this one's GIL
        prober = subprocess.Popen([sys.executable, "-c", PROBE, server.url],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

        # one client for the 25 threads: each httpx.Client costs ~30 ms of CPU to make (its SSL
        # context), 3 s for 100, which on a 2-core machine took the API's core in the test
        # rather than in the flood a real API sees (its clients are on other machines)
        h = httpx.Client(base_url=server.url, timeout=60,
                         limits=httpx.Limits(max_connections=25))

        def flood(i: int) -> str:
            r = h.post("/v1/jobs", json={"workload": tir(100 + i), "trials": 4}, headers=alice)
            assert r.status_code in (202, 429), r.text
            return "created" if r.status_code == 202 else str(r.json()["code"])

        t0 = time.perf_counter()
        try:
            time.sleep(0.5)
            with h, ThreadPoolExecutor(max_workers=25) as pool:
                answers = list(pool.map(flood, range(100)))
                other = h.post("/v1/jobs", json=SUBMIT, headers=bob)
        finally:
            out, _ = prober.communicate("stop\n", timeout=60)
        took = time.perf_counter() - t0
        stamped = json.loads(out)
        health = [d for _, d in stamped]
        import os as _os
        if _os.environ.get("FLOOD_DEBUG"):
            print("\nslow probes (s after the flood began, ms):",
                  [(round(t - t0, 2), round(d * 1e3)) for t, d in stamped if d > 0.03])
    finally:
        server.stop()
    assert other.status_code == 202, other.text
    created, busy = answers.count("created"), answers.count("parse_busy")
    assert created >= 2 and busy >= 50 and created + busy == 100, answers
    health.sort()
    p99 = health[min(len(health) - 1, int(0.99 * len(health)))]
    print(f"\nflood: {created} created, {busy} parse_busy in {took:.1f} s; /healthz p99 "
          f"{p99 * 1e3:.1f} ms, median {statistics.median(health) * 1e3:.1f} ms over "
          f"{len(health)} probes")
    # 22-44 ms over ten runs on a 2-core machine, once parse children ran in the idle class
    # with their autogroup at the lowest weight (`tuner.core.lean`); 35-80 ms before; 9-23 ms
    # over 120-127 probes with forked parse children (`tuner.core.zygote`). On a Zen 4 that
    # was 32-56 ms: the fork server started with the flood's first parse (a 140-170 ms probe,
    # then a 30-55 ms one); the API starts it at start-up now (`isolate.prestart`), the flood
    # takes 1.1-1.3 s instead of 2.4-2.6, and p99 is 17-22 ms over 152-168 probes 3 ms apart
    # (one probe of 80-115 ms as the 25 clients' first requests land at once).
    # At least 100 probes, or the "p99" is the slowest probe.
    assert len(health) >= 100 and p99 < P99_BOUND_S and statistics.median(health) < 0.01, (
        f"/healthz p99 {p99 * 1e3:.1f} ms over {len(health)} probes, median "
        f"{statistics.median(health) * 1e3:.1f} ms; the flood took {took:.1f} s")
