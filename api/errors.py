"""Every error the API answers is RFC 9457 `application/problem+json` with a stable `code`.

This is the one place exceptions become problems: tunefarm's own errors (`tuner.core.errors`),
request
validation (including a body that is not JSON at all), Starlette's HTTP exceptions, Redis outages,
and anything unexpected (a 500 `internal_error` whose details stay in the server log).
"""

from __future__ import annotations

import json
import logging
import math
from http import HTTPStatus
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.core.errors import Conflict, DatabaseError, NotFound, SpecError, TunefarmError

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "urn:tunefarm:problem:"

# stable code -> HTTP status
STATUS: dict[str, int] = {
    "invalid_spec": 422,
    "invalid_target": 422,
    "validation_error": 422,
    "idempotency_conflict": 422,
    "malformed_json": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "invalid_transition": 409,
    "payload_too_large": 413,
    "rate_limited": 429,  # per-principal request rate (Retry-After)
    "quota_exceeded": 429,  # per-owner queued jobs / trials (Retry-After)
    "parse_budget": 429,  # per-principal TVMScript texts parsed a minute (Retry-After)
    "parse_busy": 429,  # every TVMScript parser of the API busy, and the queue full
    "bad_cursor": 400,  # a records/jobs cursor that is not one this API handed out
    "bad_event_id": 400,  # a Last-Event-ID that is not a stream id
    "unknown_trial": 409,  # a result for a trial the tuner never issued (or expired)
    "trial_mismatch": 409,  # a result whose job/workload/target/device/candidate differ
    "not_lease_holder": 409,  # a result for a trial whose lease another worker holds
    "trial_used": 409,  # a second, different result for a trial already answered
    "implausible_latency": 422,  # a result faster than any device (min latency, max op rate)
    "database_error": 503,
    "unavailable": 503,
    "internal_error": 500,
}

# FastAPI's own 400 is a body it could not parse (not UTF-8, nested too deep for the parser)
_HTTP_CODES = {400: "malformed_json", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "payload_too_large", 503: "unavailable"}


class ApiProblem(TunefarmError):
    """An error raised by the API itself with an explicit code (and optional extensions)."""

    def __init__(self, code: str, detail: str, *, status: int | None = None,
                 headers: dict[str, str] | None = None, **extensions: Any) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status or STATUS.get(code, 400)
        self.headers = headers or {}
        self.extensions = extensions


def problem(status: int, code: str, detail: str, *, instance: str | None = None,
            headers: dict[str, str] | None = None, **extensions: Any) -> JSONResponse:
    """A problem+json response."""
    body: dict[str, Any] = {
        "type": TYPE_BASE + code,
        "title": _title(status),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extensions.items() if v is not None})
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _status_of(exc: TunefarmError) -> int:
    code = getattr(exc, "code", "")
    if code in STATUS:
        return STATUS[code]
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, SpecError):
        return 422
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, DatabaseError):
        return 503
    return 500


async def _tunefarm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TunefarmError)
    if isinstance(exc, ApiProblem):
        return problem(exc.status, exc.code, exc.detail, instance=request.url.path,
                       headers=exc.headers, **exc.extensions)
    status = _status_of(exc)
    code = str(getattr(exc, "code", "internal_error"))
    if isinstance(exc, SpecError):
        field = exc.field
        return problem(status, code, exc.detail, instance=request.url.path, field=field,
                       errors=[{"loc": field, "msg": exc.detail, "type": code}])
    if isinstance(exc, DatabaseError):
        log.error("database error on %s %s: %s", request.method, request.url.path, exc)
        return problem(status, code, "the database is unavailable or failed; try again",
                       instance=request.url.path, headers={"Retry-After": "5"})
    if status >= 500:
        log.error("error on %s %s: %s", request.method, request.url.path, exc)
    retry_after = getattr(exc, "retry_after", None)  # e.g. QuotaExceeded: a 429
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after else None
    return problem(status, code, str(exc), instance=request.url.path, headers=headers)


def _is_json_error(err: dict[str, Any]) -> bool:
    return err.get("type") == "json_invalid"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    bad_json = next((e for e in errors if _is_json_error(e)), None)
    if bad_json is not None:
        reason = (bad_json.get("ctx") or {}).get("error") or bad_json.get("msg", "")
        return problem(400, "malformed_json", f"the request body is not valid JSON: {reason}",
                       instance=request.url.path)
    clean: list[dict[str, Any]] = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
         "type": str(e.get("type", ""))} for e in errors]
    loc: list[str] = clean[0]["loc"] if clean else []
    msg = str(clean[0]["msg"]) if clean else "invalid request"
    where = ".".join(loc[1:] if len(loc) > 1 else loc)
    return problem(422, "validation_error", f"{where}: {msg}" if where else msg,
                   instance=request.url.path, errors=clean)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return problem(exc.status_code, code, detail, instance=request.url.path,
                   headers=getattr(exc, "headers", None))


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("redis error on %s %s: %s", request.method, request.url.path, exc)
    return problem(503, "unavailable", "the queue (Redis) is unavailable; try again",
                   instance=request.url.path, headers={"Retry-After": "5"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(500, "internal_error", "an internal error occurred; it has been logged",
                   instance=request.url.path)


def install(app: FastAPI) -> None:
    """Register every exception handler on `app`."""
    app.add_exception_handler(TunefarmError, _tunefarm_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.RedisError, _redis_error)
    app.add_exception_handler(Exception, _unexpected)
