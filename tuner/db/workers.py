"""Registered measurement workers: who they are, what they measure, when they were last seen.

Users see a worker as `tuner.db.views.WorkerPublic.from_row(row)`."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from ..core.errors import Forbidden, NotFound
from . import tables as m
from .store import Store
from .tables import utcnow

STATES = ("idle", "busy", "draining", "quarantined", "offline")


@dataclass(frozen=True)
class WorkerRow:
    id: str
    name: str
    device_key: str
    target: dict[str, Any]
    capabilities: dict[str, Any]
    tvm_version: str
    hostname: str
    state: str
    measured: int
    failures: int
    infra_failures: int
    registered_at: datetime
    last_seen_at: datetime

    @classmethod
    def of(cls, r: m.Worker, *, stale_after_s: float | None = None) -> WorkerRow:
        state = r.state
        stale = stale_after_s is not None and (
            r.last_seen_at < utcnow() - timedelta(seconds=stale_after_s))
        if stale:
            state = "offline"
        return cls(r.id, r.name, r.device_key, json.loads(r.target_json),
                   json.loads(r.capabilities_json), r.tvm_version, r.hostname, state, r.measured,
                   r.failures, r.infra_failures, r.registered_at, r.last_seen_at)

    @property
    def throughput_per_min(self) -> float:
        """Measurements per minute between registering and the last heartbeat (2 decimals)."""
        minutes = max((self.last_seen_at - self.registered_at).total_seconds() / 60, 1 / 60)
        return round(self.measured / minutes, 2)


def register_worker(store: Store, *, name: str, device_key: str, target_json: str,
                    capabilities: dict[str, Any], tvm_version: str, hostname: str,
                    token_id: int | None = None) -> WorkerRow:
    """A new worker row, bound to the token that registered it (`token_id`): only that token
    may act as this worker afterwards (`acting_as`)."""
    now = utcnow()
    row = m.Worker(id=uuid.uuid4().hex, name=name, device_key=device_key, target_json=target_json,
                   capabilities_json=json.dumps(capabilities, sort_keys=True),
                   tvm_version=tvm_version, hostname=hostname, state="idle", measured=0,
                   failures=0, infra_failures=0, registered_at=now, last_seen_at=now,
                   token_id=token_id)
    with store.session() as s:
        s.add(row)
        s.flush()
        return WorkerRow.of(row)


def heartbeat(store: Store, worker_id: str, *, state: str, measured: int, failures: int,
              infra_failures: int) -> WorkerRow:
    with store.session() as s:
        row = s.get(m.Worker, worker_id, with_for_update=True)
        if row is None:
            raise NotFound(f"no worker {worker_id!r}: register first")
        row.state = state if state in STATES else "idle"
        row.measured, row.failures, row.infra_failures = measured, failures, infra_failures
        row.last_seen_at = utcnow()
        s.flush()
        return WorkerRow.of(row)


def get_worker(store: Store, worker_id: str) -> WorkerRow | None:
    with store.session() as s:
        row = s.get(m.Worker, worker_id)
        return WorkerRow.of(row) if row else None


def list_workers(store: Store, *, stale_after_s: float = 30.0) -> list[WorkerRow]:
    """Every registered worker, newest first; one not seen for `stale_after_s` shows "offline"."""
    with store.session() as s:
        rows = s.scalars(select(m.Worker).order_by(m.Worker.registered_at.desc()))
        return [WorkerRow.of(r, stale_after_s=stale_after_s) for r in rows]


def serving(store: Store, device_key: str, *, stale_after_s: float = 30.0) -> tuple[int, int]:
    """(workers of `device_key` alive and measuring, those alive but quarantined): alive is
    seen within `stale_after_s`; a draining worker takes no new work."""
    since = utcnow() - timedelta(seconds=stale_after_s)
    with store.session() as s:
        states = list(s.scalars(select(m.Worker.state).where(
            m.Worker.device_key == device_key, m.Worker.last_seen_at >= since)))
    return (sum(st in ("idle", "busy") for st in states),
            sum(st == "quarantined" for st in states))


def live_ids(store: Store, device_key: str, *, stale_after_s: float = 30.0) -> list[str]:
    """Ids of the workers of `device_key` seen within `stale_after_s` and taking work."""
    since = utcnow() - timedelta(seconds=stale_after_s)
    with store.session() as s:
        return list(s.scalars(select(m.Worker.id).where(
            m.Worker.device_key == device_key, m.Worker.last_seen_at >= since,
            m.Worker.state.in_(("idle", "busy")))))


def max_cores(store: Store, device_key: str) -> int | None:
    """The most `num-cores` of any worker registered for `device_key` (None: none registered,
    or none says)."""
    with store.session() as s:
        targets = s.scalars(select(m.Worker.target_json).where(m.Worker.device_key == device_key))
        cores = [json.loads(t).get("num-cores") for t in targets]
    known = [c for c in cores if isinstance(c, int) and not isinstance(c, bool)]
    return max(known) if known else None


def acting_as(store: Store, worker_id: str, token_id: int, *, admin: bool = False) -> WorkerRow:
    """The worker `worker_id`, if the token `token_id` registered it (an admin token may act as
    any worker): NotFound for an unknown worker, Forbidden for another token's worker, so a
    worker token cannot heartbeat, lease or post results as a worker it did not register."""
    with store.session() as s:
        row = s.get(m.Worker, worker_id)
        if row is None:
            raise NotFound(f"no worker {worker_id!r}: register first")
        if not admin and row.token_id != token_id:
            raise Forbidden(f"worker {worker_id!r} was registered with another token")
        return WorkerRow.of(row)
