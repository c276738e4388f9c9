"""Registered measurement workers: who they are, what they measure, when they were last seen."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from ..errors import NotFound
from . import models as m
from .models import utcnow
from .store import Store

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
        if stale_after_s is not None and r.last_seen_at < utcnow() - timedelta(seconds=stale_after_s):
            state = "offline"
        return cls(r.id, r.name, r.device_key, json.loads(r.target_json),
                   json.loads(r.capabilities_json), r.tvm_version, r.hostname, state, r.measured,
                   r.failures, r.infra_failures, r.registered_at, r.last_seen_at)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        minutes = max((self.last_seen_at - self.registered_at).total_seconds() / 60, 1 / 60)
        d["throughput_per_min"] = round(self.measured / minutes, 2)
        d["registered_at"] = self.registered_at.isoformat()
        d["last_seen_at"] = self.last_seen_at.isoformat()
        return d


def register_worker(store: Store, *, name: str, device_key: str, target_json: str,
                    capabilities: dict[str, Any], tvm_version: str, hostname: str) -> WorkerRow:
    now = utcnow()
    row = m.Worker(id=uuid.uuid4().hex, name=name, device_key=device_key, target_json=target_json,
                   capabilities_json=json.dumps(capabilities, sort_keys=True),
                   tvm_version=tvm_version, hostname=hostname, state="idle", measured=0,
                   failures=0, infra_failures=0, registered_at=now, last_seen_at=now)
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
