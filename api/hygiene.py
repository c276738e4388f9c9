"""HTTP hygiene at the edge, as pure ASGI middleware (no request is parsed before these ran).

`BodyLimitMiddleware`: a request body limit (`Settings.max_body_bytes`). A request whose
`Content-Length` is over the limit is answered 413 `payload_too_large` at once, before anything
of its body is read. A body without a length (chunked) is counted while the app reads it: the
chunk that crosses the limit is never handed to the app (so nothing over the limit is parsed);
the app's own answer to the failed read is dropped and the 413 problem is sent instead.

`NulFreeUrlMiddleware`: a URL with a NUL character (`%00`, in the path or the query) is a 422
`validation_error`: no identifier, key, cursor or spec of this API contains one, and SQL text
cannot hold one (it would surface as a database error).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .asgi import HttpMiddleware
from .errors import PROBLEM_JSON, STATUS, TYPE_BASE

CODE = "payload_too_large"


class BodyTooLarge(Exception):
    """Raised from `receive` to the app when the body crosses the limit (the middleware answers)."""


async def send_problem(send: Send, code: str, detail: str, path: str, **extensions: Any) -> None:
    """Answer a problem+json straight to the ASGI `send` (the connection is closed after it)."""
    status = STATUS[code]
    body = json.dumps({"type": TYPE_BASE + code, "title": HTTPStatus(status).phrase,
                       "status": status, "detail": detail, "code": code, "instance": path,
                       **extensions}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None


async def send_too_large(send: Send, limit: int, path: str) -> None:
    await send_problem(send, CODE, f"the request body is larger than the limit of {limit} bytes",
                       path, limit=limit)


class BodyLimitMiddleware(HttpMiddleware):
    """Refuse HTTP request bodies larger than `max_bytes` with a 413 problem."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, path = self.max_bytes, str(scope.get("path", ""))
        length = _content_length(scope)
        if length is not None and length > limit:
            await send_too_large(send, limit, path)
            return
        seen = 0
        exceeded = started = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            if exceeded:
                raise BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # the app's answer to a body it could not read: ours goes instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await send_too_large(send, limit, path)


class NulFreeUrlMiddleware(HttpMiddleware):
    """Refuse a request whose path or query string holds a NUL character (422)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, query = str(scope.get("path", "")), bytes(scope.get("query_string", b""))
        if "\x00" in path or b"\x00" in query or b"%00" in query:
            await send_problem(send, "validation_error", "the URL contains a NUL character "
                               "(%00)", path.replace("\x00", "%00"))
            return
        await self.app(scope, receive, send)
