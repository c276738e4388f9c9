"""Server-sent events of a job, read from its Redis stream `Keys.events(job_id)`.

Each stream entry {"event": type, "data": json} becomes `id: <entry id>`, `event: <type>`,
`data: <json>`. A client reconnecting with `Last-Event-ID` gets everything after that entry. The
stream ends after a "state" event whose state is terminal. Redis may have lost the events (a
flush): the handler also asks SQL now and then, and when SQL says the job is finished it sends a
final "state" event itself and ends. While nothing happens, a comment line keeps proxies from
closing the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import redis
from starlette.concurrency import run_in_threadpool

from tuner.db.tables import JobState

from .context import ApiContext
from .errors import ApiProblem

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TERMINAL = frozenset(s.value for s in JobState if s.is_terminal)
_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")  # ASCII digits: `\d` also takes "١٢"
_ID_PART_LIMIT = 1 << 64  # each part of a Redis stream id is an unsigned 64-bit integer

BLOCK_MS = 1000  # one XREAD waits this long for new entries
SQL_CHECK_S = 2.0  # how often an idle stream asks SQL whether the job finished
KEEPALIVE_S = 15.0


def parse_last_event_id(value: str | None) -> str:
    """The stream id to read after ("0-0": from the start); anything that is not a Redis
    stream id `<ms>-<seq>` (each part below 2**64) is a 400 `bad_event_id`."""
    if value is None or not value.strip():
        return "0-0"
    value = value.strip()
    found = _ID.fullmatch(value)
    if found is None or any(int(part) >= _ID_PART_LIMIT for part in found.groups()):
        shown = value if len(value) <= 64 else value[:64] + "..."
        raise ApiProblem("bad_event_id",
                         f"Last-Event-ID {shown!r} is not an event id this stream handed out")
    return value


def format_event(event_type: str, data: str, event_id: str | None = None) -> str:
    lines = [f"id: {event_id}"] if event_id else []
    lines.append(f"event: {event_type}")
    lines.extend(f"data: {line}" for line in (data.splitlines() or [""]))
    return "\n".join(lines) + "\n\n"


def _is_terminal(event_type: str, data: str) -> bool:
    if event_type != "state":
        return False
    try:
        return str(json.loads(data).get("state")) in TERMINAL
    except (ValueError, AttributeError):
        return False


async def _read(ctx: ApiContext, stream: str, cursor: str,
                block_ms: int | None) -> list[tuple[str, dict[str, str]]]:
    try:
        reply = cast("list[Sequence[Any]] | None",  # [[stream, entries]] (RESP2)
                     await ctx.redis.xread({stream: cursor}, count=200, block=block_ms))
    except (redis.RedisError, OSError) as exc:
        log.warning("events of %s: Redis read failed: %s", stream, exc)
        await asyncio.sleep((block_ms or BLOCK_MS) / 1000)  # no busy loop while Redis is down
        return []
    return [(eid, fields) for _, entries in reply or [] for eid, fields in entries]


async def _final_state(ctx: ApiContext, job_id: str) -> str | None:
    """The terminal "state" event from SQL, or None while the job is still active."""
    job = await run_in_threadpool(ctx.store.get_job, job_id)
    if job is None:
        return format_event("state", json.dumps({"state": "UNKNOWN", "error": "job deleted"}))
    if not job.state.is_terminal:
        return None
    data: dict[str, Any] = {"state": str(job.state)}
    if job.error:
        data["error"] = job.error
    return format_event("state", json.dumps(data))


async def event_stream(ctx: ApiContext, job_id: str, start: str = "0-0") -> AsyncIterator[str]:
    """SSE text chunks of the job's events after stream id `start`, until a terminal state."""
    block_ms, sql_check_s, keepalive_s = BLOCK_MS, SQL_CHECK_S, KEEPALIVE_S
    stream, cursor = ctx.keys.events(job_id), start
    last_sent = last_sql = time.monotonic()
    last_sql -= sql_check_s  # ask SQL at the first idle moment
    while True:
        entries = await _read(ctx, stream, cursor, block_ms)
        for eid, fields in entries:
            cursor = eid
            etype, data = fields.get("event", "message"), fields.get("data", "{}")
            yield format_event(etype, data, eid)
            if _is_terminal(etype, data):
                return
        now = time.monotonic()
        if entries:
            last_sent = now
            continue
        if now - last_sql >= sql_check_s:
            last_sql = now
            final = await _final_state(ctx, job_id)
            if final is not None:
                # the terminal event may have been published just now: prefer the real one
                for eid, fields in await _read(ctx, stream, cursor, None):
                    etype, data = fields.get("event", "message"), fields.get("data", "{}")
                    yield format_event(etype, data, eid)
                    if _is_terminal(etype, data):
                        return
                yield final
                return
        if now - last_sent >= keepalive_s:
            last_sent = now
            yield ": keep-alive\n\n"
