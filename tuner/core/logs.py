"""Service logging: one line per event on stderr, as text (the default) or as one JSON object per
line (`TUNEFARM_LOG_FORMAT=json`), for a log collector.

A JSON line holds `ts` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, the
`job_id` and `trial_id` the process is working on when it is working on one, and `exc_info` (the
formatted traceback) when the record carries one:

    {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "workers.agent",
     "message": "trial 3f2a...: ok 12.3 us in 0.4 s", "job_id": "...", "trial_id": "3f2a..."}

The ids come from context variables: `bound(job_id=..., trial_id=...)` sets them for a block (the
tuner around a job, the worker around a trial). Context variables belong to a thread: a thread
started inside a block sees them only if it runs in a copy of the context (`carry`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, ParamSpec, TypeVar

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

job_id_var: ContextVar[str | None] = ContextVar("tunefarm_job_id", default=None)
trial_id_var: ContextVar[str | None] = ContextVar("tunefarm_trial_id", default=None)

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def bound(*, job_id: str | None = None, trial_id: str | None = None) -> Iterator[None]:
    """Log records of this block (in this thread) carry these ids; an id left None keeps the
    value it had (a trial inside a job keeps the job's id)."""
    tokens = []
    if job_id is not None:
        tokens.append((job_id_var, job_id_var.set(job_id)))
    if trial_id is not None:
        tokens.append((trial_id_var, trial_id_var.set(trial_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, run in a copy of the caller's context: a thread started with `target=carry(fn)`
    logs with the ids bound where it was started."""
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.run(fn, *args, **kwargs)

    return run


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        job_id, trial_id = job_id_var.get(), trial_id_var.get()
        if job_id is not None:
            out["job_id"] = job_id
        if trial_id is not None:
            out["trial_id"] = trial_id
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r} (text or json)")


def setup(fmt: LogFormat = "text", level: str | int = "INFO") -> None:
    """Log to stderr in `fmt` at `level`: the root logger gets one handler (replacing any it
    had, so calling this twice does not log twice)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
