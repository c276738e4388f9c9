"""A small synchronous client of the tunefarm API (used by `tunefarm submit` and the workers).

    c = Client("http://127.0.0.1:8000", token)
    job = c.submit_job({"workload": {"op": "matmul", "shape": [512, 512, 512]}, "trials": 64})
    for event_id, kind, data in c.events(job["id"]):
        ...

Errors are `ApiError(status, code, detail)` (`code` is the problem's stable code; status 0 when
the API could not be reached). Transient failures (connection errors, 5xx) are retried with
backoff for idempotent calls; `submit_job` is made idempotent with an Idempotency-Key.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Self

import httpx

from tuner.measure import MeasureInput, MeasureResult

log = logging.getLogger(__name__)

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def wait_ready(base_url: str, *, timeout_s: float = 60.0,
               alive: Callable[[], bool] | None = None) -> bool:
    """Poll `GET /readyz` until the API answers 200 (True), `timeout_s` passes or `alive()`
    (e.g. the server process's `poll() is None`) turns false (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (alive is None or alive()):
        try:
            if httpx.get(f"{base_url.rstrip('/')}/readyz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str,
                 problem: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.problem = problem or {}

    @property
    def transient(self) -> bool:
        return self.status == 0 or self.status >= 500 or self.status == 429


def _error(resp: httpx.Response) -> ApiError:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return ApiError(resp.status_code, str(body["code"]), str(body.get("detail", "")), body)
    return ApiError(resp.status_code, "http_error", resp.text[:500] or resp.reason_phrase)


class Client:
    def __init__(self, base_url: str, token: str | None, *, timeout: float = 10,
                 retries: int = 4, backoff_s: float = 0.25,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self.backoff_s = backoff_s
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                  timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -----------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, idempotent: bool = True,
                 **kw: Any) -> object:
        attempts = 1 + (self.retries if idempotent else 0)
        for attempt in range(attempts):
            try:
                resp = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                err = ApiError(0, "unavailable", f"cannot reach {self._http.base_url}: {exc}")
            else:
                if resp.is_success:
                    return resp.json() if resp.content else None
                err = _error(resp)
            if not err.transient or attempt == attempts - 1:
                raise err
            delay = self.backoff_s * 2 ** attempt
            log.warning("%s %s failed (%s); retrying in %.2f s", method, path, err, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _obj(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        out = self._request(method, path, **kw)
        if not isinstance(out, dict):
            raise ApiError(200, "unexpected_response", f"{path} did not answer a JSON object")
        return out

    def _list(self, method: str, path: str, **kw: Any) -> list[dict[str, Any]]:
        out = self._request(method, path, **kw)
        if not isinstance(out, list):
            raise ApiError(200, "unexpected_response", f"{path} did not answer a JSON list")
        return out

    # --- jobs ---------------------------------------------------------------------------------

    def submit_job(self, body: dict[str, Any],
                   idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or uuid.uuid4().hex  # makes retrying the POST safe
        return self._obj("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._obj("GET", f"/v1/jobs/{job_id}")

    def list_jobs(self, *, state: str | None = None, limit: int = 50,
                  cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if cursor:
            params["cursor"] = cursor
        return self._obj("GET", "/v1/jobs", params=params)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._obj("POST", f"/v1/jobs/{job_id}/cancel")

    # --- model jobs ---------------------------------------------------------------------------

    def submit_model(self, body: dict[str, Any],
                     idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or uuid.uuid4().hex  # makes retrying the POST safe
        return self._obj("POST", "/v1/models", json=body, headers={"Idempotency-Key": key})

    def get_model(self, model_id: str) -> dict[str, Any]:
        return self._obj("GET", f"/v1/models/{model_id}")

    def list_models(self, *, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        """One page of model jobs: {"items": [...], "next_cursor": ... (None: the last)}."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._obj("GET", "/v1/models", params=params)

    def cancel_model(self, model_id: str) -> dict[str, Any]:
        return self._obj("POST", f"/v1/models/{model_id}/cancel")

    def records(self, job_id: str, *, limit: int = 100,
                cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._obj("GET", f"/v1/jobs/{job_id}/records", params=params)

    def events(self, job_id: str, last_event_id: str | None = None, *,
               max_reconnects: int = 20) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
        """(id, type, data) of each event until the job's terminal "state" event; a dropped
        connection is resumed with Last-Event-ID (nothing is missed or repeated)."""
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                for eid, etype, data in self._sse(f"/v1/jobs/{job_id}/events", headers):
                    failures = 0
                    last_event_id = eid or last_event_id
                    yield eid, etype, data
                    if etype == "state" and data.get("state") in TERMINAL:
                        return
            except ApiError as err:
                if not err.transient or failures >= max_reconnects:
                    raise
                failures += 1
            except (httpx.TransportError, httpx.StreamError) as exc:
                if failures >= max_reconnects:
                    raise ApiError(0, "unavailable", f"event stream lost: {exc}") from exc
                failures += 1
            else:
                failures += 1  # the server ended the stream without a terminal event
                if failures > max_reconnects:
                    return
            time.sleep(min(self.backoff_s * 2 ** failures, 5.0))

    def _sse(self, path: str, headers: dict[str, str]
             ) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
        timeout = httpx.Timeout(self._http.timeout.connect, read=60.0)
        with self._http.stream("GET", path, headers=headers, timeout=timeout) as resp:
            if not resp.is_success:
                resp.read()
                raise _error(resp)
            eid: str | None = None
            etype = "message"
            data: list[str] = []
            for line in resp.iter_lines():
                if line == "":
                    if data:
                        yield eid, etype, json.loads("\n".join(data))
                    eid, etype, data = None, "message", []
                elif line.startswith(":"):
                    continue
                else:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "id":
                        eid = value
                    elif name == "event":
                        etype = value
                    elif name == "data":
                        data.append(value)

    # --- best and spaces ----------------------------------------------------------------------

    def best(self, workload: str | dict[str, Any], target: str | dict[str, Any] = "host",
             device_key: str = "local") -> dict[str, Any]:
        w = workload if isinstance(workload, str) else json.dumps(workload, sort_keys=True)
        t = target if isinstance(target, str) else json.dumps(target, sort_keys=True)
        return self._obj("GET", "/v1/best",
                             params={"workload": w, "target": t, "device_key": device_key})

    def spaces(self, op: str | None = None) -> list[dict[str, Any]]:
        return self._list("GET", f"/v1/spaces/{op}" if op else "/v1/spaces")

    # --- workers ------------------------------------------------------------------------------

    def register_worker(self, *, name: str, device_key: str, target: dict[str, Any],
                        capabilities: dict[str, Any] | None = None, tvm_version: str = "",
                        hostname: str = "") -> dict[str, Any]:
        body = {"name": name, "device_key": device_key, "target": target,
                "capabilities": capabilities or {}, "tvm_version": tvm_version,
                "hostname": hostname}
        return self._obj("POST", "/v1/workers", json=body, idempotent=False)

    def heartbeat(self, worker_id: str, *, state: str = "idle", measured: int = 0,
                  failures: int = 0, infra_failures: int = 0) -> dict[str, Any]:
        body = {"state": state, "measured": measured, "failures": failures,
                "infra_failures": infra_failures}
        return self._obj("POST", f"/v1/workers/{worker_id}/heartbeat", json=body)

    def list_workers(self) -> list[dict[str, Any]]:
        return self._list("GET", "/v1/workers")

    def post_result(self, worker_id: str, inp: MeasureInput, res: MeasureResult) -> dict[str, Any]:
        body = {"input": json.loads(inp.to_json()), "result": json.loads(res.to_json())}
        return self._obj("POST", f"/v1/workers/{worker_id}/results", json=body)

    def lease(self, worker_id: str, *, max_entries: int = 1,
              wait_s: float = 1.0) -> list[dict[str, Any]]:
        """Up to `max_entries` measurements for this worker, waiting up to `wait_s` (<= 10) for
        one: [{"entry_id", "deliveries", "input": MeasureInput dict}]. Not retried here (a lost
        answer's entries come back after the lease): the caller's loop asks again."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=wait_s + 30.0,
                                write=self._http.timeout.write, pool=self._http.timeout.pool)
        out = self._obj("POST", f"/v1/workers/{worker_id}/lease", idempotent=False,
                        json={"max": max_entries, "wait_s": wait_s}, timeout=timeout)
        entries = out.get("entries")
        if not isinstance(entries, list):
            raise ApiError(200, "unexpected_response", "the lease did not answer entries")
        return entries

    def _entries(self, worker_id: str, action: str, entry_ids: list[str],
                 **extra: Any) -> list[str]:
        out = self._obj("POST", f"/v1/workers/{worker_id}/{action}",
                        json={"entry_ids": entry_ids, **extra})
        return [str(x) for x in out.get("entry_ids") or []]

    def renew(self, worker_id: str, entry_ids: list[str]) -> list[str]:
        """Keep the lease of entries this worker holds; the ids it still holds."""
        return self._entries(worker_id, "renew", entry_ids)

    def ack(self, worker_id: str, entry_ids: list[str]) -> list[str]:
        """Acknowledge entries whose results the API took; the ids acknowledged."""
        return self._entries(worker_id, "ack", entry_ids)

    def dead_letter(self, worker_id: str, entry_ids: list[str], reason: str) -> list[str]:
        """Give up on entries this worker holds (dead letters); the ids dropped."""
        return self._entries(worker_id, "dead-letter", entry_ids, reason=reason[:2000])
