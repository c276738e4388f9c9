"""`RemoteDatabase`: a read-only MetaSchedule database over the service's `GET /v1/best`, for a
compiler CI job that has the API's URL and a token and nothing else (no SQL credentials):

    with target, RemoteDatabase("https://farm:8000", token):
        mod = relax.transform.MetaScheduleApplyDatabase()(partitioned)

A query asks for the best record of the module's computation (`tir-<identity hash>`, the key
`tunefarm tune-model` and `tunefarm tune tir` store it under) on the target, without the host a
relax build attaches, for the database's device key. The record's trace is replayed onto the
module asked about; a module whose record does not replay there, or that has none, gets None,
and the build keeps its default loops. Committing raises: tuning goes through jobs.
"""

from __future__ import annotations

import json
from typing import Any, cast

from schedules.registry import replay
from tuner.core.tvm_api import IRModule, Target, Trace, derived_object, ms, target_to_dict
from tuner.workloads.identity import identity_hash

from . import ApiError, Client


@derived_object
class RemoteDatabase(ms.database.PyDatabase):
    """Answers `query_tuning_record` (hence `query_schedule` and relax's
    `MetaScheduleApplyDatabase`) from `GET /v1/best`; has no records of its own."""

    def __init__(self, base_url: str, token: str | None, device_key: str = "local", *,
                 client: Client | None = None) -> None:
        super().__init__()
        self.client = client or Client(base_url, token)
        self.device_key = device_key
        self._answers: dict[tuple[str, str], dict[str, Any] | None] = {}

    def _best(self, mod: IRModule, target: Target) -> dict[str, Any] | None:
        t = target_to_dict(target)
        t.pop("host", None)  # records are stored for the bare target
        key = (f"tir-{identity_hash(mod)}", json.dumps(t, sort_keys=True))
        if key not in self._answers:
            try:
                self._answers[key] = self.client.best(key[0], t, self.device_key)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                self._answers[key] = None
        return self._answers[key]

    def query_tuning_record(self, mod: IRModule, target: Target,
                            workload_name: str | None = None) -> ms.database.TuningRecord | None:
        rec = self._best(mod, target)
        if rec is None:
            return None
        trace_json = json.dumps(rec["trace"])
        try:
            sch = replay(mod, trace_json)  # registers the tensor intrinsics the trace names
        except Exception:  # recorded on another spelling whose block names differ: no answer
            return None
        return ms.database.TuningRecord(  # a replayed schedule is traced
            cast(Trace, sch.trace), ms.database.Workload(mod),
            [float(x) for x in rec["latencies_s"]],
            target, ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))

    def has_workload(self, mod: IRModule) -> bool:
        return False  # only queries with a target are answered

    def commit_workload(self, mod: IRModule) -> ms.database.Workload:
        raise NotImplementedError("RemoteDatabase is read-only: tune through the service's jobs")

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        raise NotImplementedError("RemoteDatabase is read-only: tune through the service's jobs")

    def get_top_k(self, workload: ms.database.Workload,
                  top_k: int) -> list[ms.database.TuningRecord]:
        return []

    def get_all_tuning_records(self) -> list[ms.database.TuningRecord]:
        return []

    def __len__(self) -> int:
        return 0
