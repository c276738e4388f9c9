"""Records as users see them: the best schedule of a workload on a target, record listings.

Shared by the CLI (`tunefarm best`, `tunefarm records`) and the REST API (GET /v1/best through
`api.best`; a worker's result becomes a record through `record_from` in `api.results`). The
shapes are the `tuner.db.views` models (`BestPublic`, `ListedRecord`), which the API also
declares in its OpenAPI document; these functions return them as JSON-ready dicts, the same
text the CLI prints with `--json` and the API sends.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar, cast

from schedules.registry import replay
from tuner.core import tvm_api as tv
from tuner.core.errors import NotFound
from tuner.db import NewRecord, Store, TargetRef, WorkloadRow, target_key
from tuner.db.views import BestPublic, ListedRecord, RecordPublic
from tuner.measure import gflops
from tuner.workloads import Workload

log = logging.getLogger(__name__)
record_from = NewRecord.from_measurement  # the SQL record of a measured MeasureInput
T = TypeVar("T")
REPLAY_TRIES = 8


def best_record(store: Store, workload: Workload, target: dict[str, Any],
                device_key: str = "local") -> dict[str, Any]:
    """The fastest valid record that may be served (a `BestPublic`: a worker's record only once
    a second measurement confirmed it, at the slower median), with the schedule as replayable
    trace JSON and as Python. `NotFound` when the workload has no valid record on that target.
    A record whose trace no longer replays (imported, or from another TVM) is passed over for
    the next fastest, among the `REPLAY_TRIES` fastest."""
    tjson = tv.canonical_target_json(tv.make_target(target))
    wrow = store.workload_by_key(workload.key)
    tref = store.target_by_key(target_key(tjson, device_key))
    top = store.best(wrow.id, tref.id, k=REPLAY_TRIES, served=True) if wrow and tref else []
    for row in top:
        try:
            sch = replay(workload.mod(), row.trace_json)
        except Exception as exc:  # TVM raises ValueError, TVMError, ... on a bad trace
            log.warning("record %s of %s does not replay (%s); trying the next fastest",
                        row.trial_id, workload.key, str(exc).splitlines()[0][:200])
            continue
        break
    else:
        why = "tune it first" if not top else (
            f"none of its {len(top)} fastest records replays here")
        raise NotFound(f"no valid record for {workload.description} ({workload.key}) on target "
                       f"{tjson} / device {device_key!r}: {why}")
    fields = RecordPublic.fields_of(row, workload_key=workload.key, flops=workload.flops,
                                    target_json=tjson, device_key=device_key)
    fields.update(latency_s=row.served_s, gflops=gflops(workload.flops, row.served_s))
    rec = BestPublic(
        **fields,
        workload=workload.spec,
        # a replayed schedule is traced
        schedule_python="\n".join(cast(tv.Trace, sch.trace).as_python(remove_postproc=True)))
    return rec.model_dump(mode="json")


def list_records(store: Store, workload: Workload | None = None, *, limit: int = 20,
                 job_id: str | None = None, only_ok: bool = False) -> list[dict[str, Any]]:
    """Newest records first (each a `ListedRecord`), of one workload or of all; of one job
    (`job_id`); valid ones only (`only_ok`)."""
    wid = None
    if workload is not None:
        wrow = store.workload_by_key(workload.key)
        if wrow is None:
            return []
        wid = wrow.id
    workloads: dict[int, WorkloadRow] = {}
    targets: dict[int, TargetRef] = {}
    out = []
    for row in store.records(workload_id=wid, job_id=job_id, only_ok=only_ok, order="newest",
                             limit=limit):
        w = workloads.get(row.workload_id) or _cache(workloads, row.workload_id,
                                                     store.get_workload(row.workload_id))
        t = targets.get(row.target_id) or _cache(targets, row.target_id,
                                                 store.get_target(row.target_id))
        rec = ListedRecord(**RecordPublic.fields_of(
            row, workload_key=w.key, flops=w.flops, target_json=t.target_json,
            device_key=t.device_key), workload=w.description)
        out.append(rec.model_dump(mode="json"))
    return out


def _cache(into: dict[int, T], key: int, value: T | None) -> T:
    if value is None:  # a record's foreign keys always resolve; a missing row is a bug
        raise LookupError(f"row {key} referenced by a record does not exist")
    into[key] = value
    return value
