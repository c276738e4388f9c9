"""Liveness and counts read from SQL for the service's health checks and metrics (the API's
/readyz and /metrics ask these; the SQL stays in this package)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError

from . import tables as m
from .engine import wrap_error
from .store import Store


@dataclass(frozen=True)
class Counts:
    jobs_by_state: dict[str, int]  # every JobState, 0 where no job has it
    records: int


def ping(store: Store) -> None:
    """Return if the database answers a trivial query (`DatabaseError` otherwise)."""
    try:
        with store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        raise wrap_error(exc, store.safe_url) from exc


def counts(store: Store) -> Counts:
    """Jobs by state and the number of measured records stored."""
    with store.session() as s:
        by_state = {str(state): int(n) for state, n in
                    s.execute(select(m.Job.state, func.count()).group_by(m.Job.state))}
        records = s.scalar(select(func.count()).select_from(m.Record)) or 0
    return Counts({state.value: by_state.get(state.value, 0) for state in m.JobState},
                  int(records))
