"""The OpenAPI document as a generated client needs it: every error an operation can answer,
each as `application/problem+json` (`api.errors`), added to what the routes declare.

    install(app)   app.openapi() builds the document once, then post-processes it:

- every 4xx/5xx response of every operation is a `Problem` in `application/problem+json`;
- what every operation can answer is declared on it: 401/403 with a bearer token, 429 on
  rate-limited ones (every authenticated one), 400 (`malformed_json`), 413 and 422 where there
  is a body, 422 where there are parameters, 404 where the path names something, 503 when the
  database or Redis is unavailable;
- the event id (`Last-Event-ID`, `after`) and page `cursor` parameters carry the patterns the
  API checks (the API answers a mismatch with its 400 `bad_event_id` / `bad_cursor`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tuner.queue.streams import STREAM_ID

from .errors import PROBLEM_JSON

_REF = {"$ref": "#/components/schemas/Problem"}
_WHY = {400: "Malformed request (`malformed_json`, `bad_cursor`, `bad_event_id`)",
        401: "No token, or one that is unknown, expired or revoked", 403: "Not allowed",
        404: "Not found", 409: "Conflict", 413: "Request body too large",
        422: "Validation error", 429: "Rate limit, quota or parse budget (`Retry-After`)",
        503: "Database or Redis unavailable"}
# api.events.parse_last_event_id: a stream id, blanks around it ignored; empty: from the start
EVENT_ID_PATTERN = rf"^\s*(?:{STREAM_ID})?\s*$"
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,512}$"  # tuner.db.cursor: URL-safe base64, no padding


def _statuses(op: dict[str, Any], path: str) -> set[int]:
    out = {503}
    params = op.get("parameters", [])
    if op.get("security"):
        out |= {401, 403, 429}
    if "requestBody" in op:
        out |= {400, 413, 422}
    if params:
        out.add(422)
    if any(p.get("in") == "path" for p in params):
        out.add(404)
    return out


def _problem_responses(op: dict[str, Any], path: str) -> None:
    responses = op.setdefault("responses", {})
    for status in _statuses(op, path):
        responses.setdefault(str(status), {"description": _WHY[status]})
    for status, resp in responses.items():
        if status[0] in "45":
            resp["content"] = {PROBLEM_JSON: {"schema": _REF}}


def _patterns(op: dict[str, Any]) -> None:
    for p in op.get("parameters", []):
        name = (p.get("in"), p.get("name", "").lower())
        pattern = {("header", "last-event-id"): EVENT_ID_PATTERN, ("query", "after"):
                   EVENT_ID_PATTERN, ("query", "cursor"): CURSOR_PATTERN}.get(name)
        if pattern is None:
            continue
        schema = p.setdefault("schema", {})
        for alt in schema.get("anyOf", [schema]):  # Optional[str]: {"anyOf": [str, null]}
            if alt.get("type") == "string":
                alt["pattern"] = pattern


def install(app: FastAPI) -> None:
    from .schemas import Problem

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description,
                          routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault("Problem", Problem.model_json_schema(
            ref_template="#/components/schemas/{model}"))
        for path, ops in doc.get("paths", {}).items():
            for op in ops.values():
                _problem_responses(op, path)
                _patterns(op)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
