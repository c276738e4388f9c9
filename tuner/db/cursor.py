"""Opaque page cursors (keyset pagination), encoded and parsed in this one place.

A cursor is URL-safe base64 (no padding) of a short text naming the last row of a page: a job
(or model job) page's `"<created_at ISO>|<id>"`, a record page's `"r<record id>"`. Clients pass
it back unchanged. Parsing is bounded: anything that is not a cursor this service handed out (bad
base64, wrong shape, too long, an absurd id or date) is a `BadCursor` on the field "cursor" (an
API 400 `bad_cursor` problem), never a server error.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute

from ..core.errors import SpecError

MAX_CURSOR_CHARS = 512  # longer than any cursor handed out: larger input is rejected unread
MAX_RECORD_ID = (1 << 63) - 1
MAX_JOB_ID_CHARS = 64
_JOB_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_JOB_ID_CHARS}}}")


class BadCursor(SpecError):
    """A page cursor that is not one this service handed out."""

    code = "bad_cursor"


def _bad() -> BadCursor:
    return BadCursor("not a cursor this service handed out", field="cursor")


def encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(cursor: str) -> str:
    """The text inside a cursor (`BadCursor` when it is not one)."""
    if not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise _bad()
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise _bad() from exc


def job_cursor(created_at: datetime, job_id: str) -> str:
    """The cursor after a job in a newest-first job page."""
    return encode(f"{created_at.isoformat()}|{job_id}")


def parse_job_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at, job id) of a `job_cursor`."""
    text = decode(cursor)
    when, sep, job_id = text.partition("|")
    if not sep or not _JOB_ID.fullmatch(job_id):
        raise _bad()
    try:
        at = datetime.fromisoformat(when)
        return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC), job_id
    except (ValueError, OverflowError) as exc:  # not a date; out of range once in UTC
        raise _bad() from exc


class _Dated(Protocol):
    @property
    def created_at(self) -> datetime: ...

    @property
    def id(self) -> str: ...


D = TypeVar("D", bound=_Dated)


def newest_first(q: Select[Any], created: InstrumentedAttribute[datetime],
                 row_id: InstrumentedAttribute[str], cursor: str | None,
                 limit: int) -> Select[Any]:
    """`q` as one newest-first page of rows keyed (created, row_id), after `cursor` (a
    `job_cursor`), one row more than `limit` (`page` tells from it whether another follows).
    Jobs and model jobs are paged this way."""
    q = q.order_by(created.desc(), row_id.desc()).limit(limit + 1)
    if cursor:
        when, after = parse_job_cursor(cursor)
        q = q.where(or_(created < when, and_(created == when, row_id < after)))
    return q


def page(rows: Sequence[D], limit: int) -> tuple[list[D], str | None]:
    """The page of a `newest_first` query's rows, and the cursor of the next (None: last)."""
    last = rows[limit - 1] if len(rows) > limit else None
    return list(rows[:limit]), job_cursor(last.created_at, last.id) if last is not None else None


def record_cursor(record_id: int) -> str:
    """The cursor after a record in a page of records in storage order."""
    return encode(f"r{int(record_id)}")


def parse_record_cursor(cursor: str) -> int:
    """The record id of a `record_cursor`."""
    text = decode(cursor)
    digits = text[1:]
    if (not text.startswith("r") or not 0 < len(digits) <= 19 or not digits.isascii()
            or not digits.isdigit() or int(digits) > MAX_RECORD_ID):
        raise _bad()
    return int(digits)
