"""Structured logs (tuner/core/logs.py): one JSON object per line with the job and trial ids bound
where the code works on them, and the text format by default."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tuner.core import logs


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through the JSON formatter to a buffer."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("tunefarm.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, buf
    finally:
        logger.removeHandler(handler)


def _lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_lines_carry_the_bound_job_and_trial_ids(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = captured
    logger.info("idle")
    with logs.bound(job_id="job-1"):
        logger.info("job %s starts", "job-1")
        with logs.bound(trial_id="trial-7"):  # a trial inside the job keeps the job's id
            logger.warning("trial measured:\n%s", "two lines")
        logger.info("job ends")
    logger.error("after")
    idle, start, trial, end, after = _lines(buf)
    assert set(idle) == {"ts", "level", "logger", "message"}
    assert idle["level"] == "INFO" and idle["logger"] == "tunefarm.test.logs"
    assert datetime.fromisoformat(idle["ts"].replace("Z", "+00:00")).tzinfo is not None
    assert start["job_id"] == "job-1" and "trial_id" not in start
    assert start["message"] == "job job-1 starts"
    assert trial == {**trial, "level": "WARNING", "job_id": "job-1", "trial_id": "trial-7",
                     "message": "trial measured:\ntwo lines"}
    assert end["job_id"] == "job-1" and "trial_id" not in end
    assert "job_id" not in after and after["level"] == "ERROR"
    assert len(buf.getvalue().splitlines()) == 5  # the newline in a message stays escaped


def test_exceptions_and_threads(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = captured
    with logs.bound(job_id="job-2"):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
        carried = threading.Thread(target=logs.carry(logger.info), args=("carried",))
        plain = threading.Thread(target=logger.info, args=("plain",))
        for t in (carried, plain):
            t.start()
            t.join()
    failed, from_carried, from_plain = _lines(buf)
    assert failed["job_id"] == "job-2" and "ValueError: boom" in failed["exc_info"]
    assert from_carried["job_id"] == "job-2"  # started inside the block, in a copy of it
    assert "job_id" not in from_plain  # a thread does not inherit context variables


def test_setup_selects_the_format_and_replaces_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.setup("json", "info")
        logs.setup("json", "INFO")  # twice: still one handler
        assert len(root.handlers) == 1
        with logs.bound(job_id="j", trial_id="t"):
            logging.getLogger("tuner.x").info("hello")
        logging.getLogger("tuner.x").debug("dropped")
        (line,) = capsys.readouterr().err.splitlines()
        assert json.loads(line)["trial_id"] == "t"
        logs.setup("text")
        logging.getLogger("tuner.x").info("hello")
        err = capsys.readouterr().err
        assert err.rstrip().endswith("INFO tuner.x: hello") and not err.startswith("{")
        with pytest.raises(ValueError, match="unknown log format"):
            logs.formatter("xml")  # type: ignore[arg-type]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_the_log_format_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from tuner.core.config import Settings

    monkeypatch.delenv("TUNEFARM_LOG_FORMAT", raising=False)
    assert Settings().log_format == "text"
    monkeypatch.setenv("TUNEFARM_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("TUNEFARM_LOG_FORMAT", "yaml")
    with pytest.raises(ValidationError):
        Settings()
