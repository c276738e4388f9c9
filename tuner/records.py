"""Records as users see them: the best schedule of a workload on a target, record listings.

Shared by the CLI (`tunefarm best`, `tunefarm records`) and, later, the REST API.
"""

from __future__ import annotations

import json
from typing import Any

from schedules.registry import replay
from tuner import tvm_api as tv
from tuner.config import get_settings
from tuner.db import NewRecord, RecordRow, Store, target_key
from tuner.errors import NotFound

record_from = NewRecord.from_measurement  # the SQL record of a measured MeasureInput


def record_dict(row: RecordRow, *, workload_key: str, flops: int, target_json: str | None = None,
                device_key: str | None = None) -> dict[str, Any]:
    return {
        "trial_id": row.trial_id, "job_id": row.job_id, "workload_key": workload_key,
        "target": json.loads(target_json) if target_json else None, "device_key": device_key,
        "space": row.space, "invalidity": str(row.invalidity), "error_msg": row.error_msg,
        "latency_s": row.median_s, "latencies_s": row.latencies, "cv": row.cv,
        "noisy": row.cv is not None and row.cv > get_settings().noise_cv,
        "gflops": flops / row.median_s / 1e9 if row.median_s and flops else None,
        "decisions": row.decisions, "trace": json.loads(row.trace_json), "worker": row.worker,
        "build_s": row.build_s, "tvm_version": row.tvm_version,
        "measured_at": row.measured_at.isoformat(),
    }


def best_record(store: Store, workload: Any, target: dict[str, Any], device_key: str = "local"
                ) -> dict[str, Any]:
    """The fastest valid record, with the schedule as replayable trace JSON and as Python."""
    tjson = tv.canonical_target_json(tv.make_target(target))
    wrow = store.workload_by_key(workload.key)
    tref = store.target_by_key(target_key(tjson, device_key))
    best = store.best(wrow.id, tref.id, k=1) if wrow and tref else []
    if not best:
        raise NotFound(f"no valid record for {workload.description} ({workload.key}) on target "
                       f"{tjson} / device {device_key!r}: tune it first")
    rec = record_dict(best[0], workload_key=workload.key, flops=workload.flops, target_json=tjson,
                      device_key=device_key)
    sch = replay(workload.mod(), best[0].trace_json)
    rec["workload"] = workload.spec
    rec["schedule_python"] = "\n".join(sch.trace.as_python(remove_postproc=True))
    return rec


def list_records(store: Store, workload: Any | None = None, *, limit: int = 20) -> list[dict[str, Any]]:
    """Newest records first, of one workload or of all."""
    wid = None
    if workload is not None:
        wrow = store.workload_by_key(workload.key)
        if wrow is None:
            return []
        wid = wrow.id
    workloads: dict[int, Any] = {}
    targets: dict[int, Any] = {}
    out = []
    for row in store.records(workload_id=wid, order="newest", limit=limit):
        w = workloads.get(row.workload_id) or workloads.setdefault(row.workload_id,
                                                                   store.get_workload(row.workload_id))
        t = targets.get(row.target_id) or targets.setdefault(row.target_id, store.get_target(row.target_id))
        d = record_dict(row, workload_key=w.key, flops=w.flops, target_json=t.target_json,
                        device_key=t.device_key)
        d["workload"] = w.description
        out.append(d)
    return out
