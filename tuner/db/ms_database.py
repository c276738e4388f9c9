"""`TunefarmDatabase`: a MetaSchedule database backed by the tunefarm SQL `Store`.

It lets `ms.tir_integration.compile_tir(db, mod, target)`, `ms.tune_tir(..., database=db)` and
`relax.transform.MetaScheduleApplyDatabase` work against SQLite / PostgreSQL, and unlike the
built-in databases it answers queries per target: MetaSchedule's default `query_tuning_record`
returns the best record of the workload for whatever target it was measured on.

Records are committed under, and `get_top_k` reads them for, the stored IRModule structurally
equal to the workload's (`workloads.mod_json`; rows found by the `shash` column): a trace replays
onto the module it was recorded on. Queries (`has_workload`, `query_tuning_record`, hence
`query_schedule` and relax's `MetaScheduleApplyDatabase`) match by computation instead: any stored
module with the same normal form (`tuner.workloads.identity`), so relax's int64 legalization of
`R.matmul` finds the records of `tunefarm tune matmul`. Arbitrary modules are stored under the key
`tir-<identity hash>` (`-<n>` for another spelling of the same computation) with op "tir".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from schedules.intrinsics import register_for_trace
from schedules.registry import replay

from ..measure import Invalidity, MeasureResult
from ..tvm_api import (
    canonical_target_json,
    derived_object,
    load_json,
    ms,
    shash_hex,
    structural_equal,
    trace_decisions,
    trace_to_json,
    tvm,
    tvm_version,
)
from ..workloads import canonical_json
from ..workloads.identity import identity_hash, normal_form
from .catalog import register_workload
from .engine import target_key
from .rows import NewRecord, RecordRow, TargetRef
from .store import Store

FAILED_RUN_S = 1e9  # MetaSchedule reports failed runs as run_secs=[1e10]
QUERY_DEPTH = 5  # records per stored spelling tried when a trace must replay onto another
MS_SPACE = "metaschedule"

__all__ = ["FAILED_RUN_S", "MS_SPACE", "TunefarmDatabase", "shash_hex"]


@dataclass(frozen=True)
class _BareModule:
    """A module committed through MetaSchedule, as `register_workload` takes it: key
    `tir-<shash>` (or `tir-<shash>-<n>` on a hash collision), op "tir"."""

    key: str
    module: Any
    module_hash: str
    flops: int
    op: str = "tir"

    @property
    def description(self) -> str:
        return f"TIR module {self.module_hash}"

    def spec_json(self) -> str:
        return canonical_json({"op": "tir", "shash": self.module_hash})

    def shash(self) -> str:
        return self.module_hash

    def mod(self) -> Any:
        return self.module


def _target_jsons(target: Any) -> list[str]:
    """Canonical JSON of `target`, then of the same target without its host (a relax build
    attaches the host; records are stored for the bare target)."""
    exact = canonical_target_json(target)
    d = json.loads(exact)
    if "host" not in d:
        return [exact]
    d.pop("host")
    return [exact, json.dumps(d, sort_keys=True, separators=(",", ":"))]


def _estimate_flops(mod: Any) -> int:
    try:
        return int(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # dynamic shapes, unsupported ops: the count is informational only
        return 0


@derived_object
class TunefarmDatabase(ms.database.PyDatabase):
    """A MetaSchedule `Database` over a tunefarm `Store` (a Store, a URL, or None: settings).

    `device_key` completes the target identity (the same target JSON on two boards is two
    targets). With `target` given, `get_top_k`, `get_all_tuning_records` and `__len__` only see
    that target's records (what a tuning run wants); otherwise they see every target's.
    """

    def __init__(self, store: Store | str | None = None, device_key: str = "local", *,
                 target: Any = None) -> None:
        super().__init__()
        self.store = store if isinstance(store, Store) else Store(store)
        self.device_key = device_key
        self._workloads: dict[int, Any] = {}  # workload id -> ms Workload (stable identity)
        self._by_shash: dict[str, list[int]] = {}  # shash -> ids whose Workload is cached
        self._normal: dict[int, Any] = {}  # workload id -> the normal form of its module
        self._targets: dict[int, dict[str, Any]] = {}  # target id -> target JSON dict
        self.target_id: int | None = None
        if target is not None:
            self.target_id = self._ensure_target(target).id

    # --- helpers ---------------------------------------------------------------------------

    def _workload(self, workload_id: int, mod_json: str | None = None) -> Any:
        if workload_id not in self._workloads:
            if mod_json is None:
                row = self.store.get_workload(workload_id)
                if row is None:
                    raise LookupError(f"workload {workload_id} is not in {self.store!r}")
                mod_json = row.mod_json
            self._workloads[workload_id] = ms.database.Workload(load_json(mod_json))
        return self._workloads[workload_id]

    def _candidates(self, h: str, *, refresh: bool = False) -> list[int]:
        """Ids of the stored workloads whose `shash` column is `h` (their Workloads cached; read
        from the store again with `refresh`: another process may have added one)."""
        if refresh or h not in self._by_shash:
            rows = [r for r in self.store.workload_by_shash(h) if r.mod_json]
            for row in rows:
                self._workload(row.id, row.mod_json)
            self._by_shash[h] = [r.id for r in rows]
        return self._by_shash[h]

    def _find(self, mod: Any) -> tuple[int | None, Any]:
        """(workload id, Workload) of a structurally equal stored module, or (None, None): what
        records are committed under and read back for (their traces replay onto that module)."""
        hashes = dict.fromkeys((identity_hash(mod), shash_hex(mod)))  # new rows, then old ones
        for refresh in (False, True):
            for h in hashes:
                for wid in self._candidates(h, refresh=refresh):
                    if structural_equal(self._workloads[wid].mod, mod):
                        return wid, self._workloads[wid]
        return None, None

    def _same(self, mod: Any) -> list[tuple[int, Any]]:
        """Every stored workload computing what `mod` computes, however spelled
        (`workloads.identity`): relax's int64 legalization of an op spec finds the op spec."""
        norm = normal_form(mod)
        out: list[tuple[int, Any]] = []
        for refresh in (False, True):
            for h in dict.fromkeys((shash_hex(norm), shash_hex(mod))):
                for wid in self._candidates(h, refresh=refresh):
                    if wid not in self._normal:
                        self._normal[wid] = normal_form(self._workloads[wid].mod)
                    if all(w != wid for w, _ in out) and structural_equal(self._normal[wid], norm):
                        out.append((wid, self._workloads[wid]))
            if out:
                return out
        return out

    def _ensure_target(self, target: Any) -> TargetRef:
        return self.store.ensure_target(canonical_target_json(target), self.device_key)

    def _target_id(self, target: Any) -> int | None:
        for tj in _target_jsons(target):
            ref = self.store.target_by_key(target_key(tj, self.device_key))
            if ref is not None:
                return ref.id
        return None

    def _target(self, target_id: int) -> Any:
        if target_id not in self._targets:
            ref = self.store.get_target(target_id)
            if ref is None:
                raise LookupError(f"target {target_id} is not in {self.store!r}")
            self._targets[target_id] = json.loads(ref.target_json)
        return self._targets[target_id]

    def _to_tuning_record(self, row: RecordRow, workload: Any) -> Any:
        register_for_trace(row.trace_json)  # the caller replays it: its intrinsics must exist
        run_secs = row.latencies if row.ok and row.latencies else [FAILED_RUN_S * 10]
        args_info = ms.arg_info.ArgInfo.from_entry_func(workload.mod, remove_preproc=True)
        return ms.database.TuningRecord.from_json(
            [json.loads(row.trace_json), [float(x) for x in run_secs],
             self._target(row.target_id), [a.as_json() for a in args_info]],
            workload)

    # --- the PyDatabase interface ----------------------------------------------------------

    def has_workload(self, mod: Any) -> bool:
        """Whether records of `mod`'s computation may exist (in any spelling of it)."""
        return bool(self._same(mod))

    def commit_workload(self, mod: Any) -> Any:
        wid, wl = self._find(mod)
        if wl is not None:
            return wl
        shash = identity_hash(mod)
        taken = {row.key for row in self.store.workload_by_shash(shash)}
        key, n = f"tir-{shash}", 0
        while key in taken:  # another spelling of the computation, or a hash collision
            n += 1
            key = f"tir-{shash}-{n}"
        wid = register_workload(self.store, _BareModule(key, mod, shash, _estimate_flops(mod)))
        self._candidates(shash, refresh=True)
        return self._workload(wid)

    def commit_tuning_record(self, record: Any) -> None:
        wid, _ = self._find(record.workload.mod)
        if wid is None:
            self.commit_workload(record.workload.mod)
            wid, _ = self._find(record.workload.mod)
            if wid is None:
                raise LookupError("the committed workload is not found again")
        if record.target is not None:
            tid = self._ensure_target(record.target).id
        elif self.target_id is not None:
            tid = self.target_id
        else:
            raise ValueError("the tuning record has no target and the database is not bound to one")
        secs = [float(s) for s in (record.run_secs or [])]
        ok = bool(secs) and all(s < FAILED_RUN_S for s in secs)
        trace_json = trace_to_json(record.trace)
        digest = hashlib.sha256(f"{wid}|{tid}|{trace_json}|{secs}".encode()).hexdigest()
        res = (MeasureResult(f"ms-{digest[:40]}", Invalidity.OK, latencies_s=tuple(secs)) if ok
               else MeasureResult.failure(f"ms-{digest[:40]}", Invalidity.RUN_ERROR,
                                          "MetaSchedule reported a failed run"))
        self.store.add_records([NewRecord(
            trial_id=res.trial_id, workload_id=wid, target_id=tid, space=MS_SPACE,
            cand_hash=shash_hex(record.as_measure_candidate().sch.mod), trace_json=trace_json,
            decisions=trace_decisions(record.trace), latencies=list(res.latencies_s),
            median_s=res.median_s, cv=res.cv, invalidity=res.invalidity, error_msg=res.error_msg,
            tvm_version=tvm_version())])

    def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
        wid, wl = self._find(workload.mod)
        if wid is None or top_k <= 0:
            return []
        rows = self.store.records(workload_id=wid, target_id=self.target_id, only_ok=True,
                                  limit=int(top_k), order="median")
        return [self._to_tuning_record(r, wl) for r in rows]

    def get_all_tuning_records(self) -> list[Any]:
        return [self._to_tuning_record(r, self._workload(r.workload_id))
                for r in self.store.records(target_id=self.target_id)]

    def __len__(self) -> int:
        return self.store.count_records(target_id=self.target_id)

    def query_tuning_record(self, mod: Any, target: Any, workload_name: str | None = None) -> Any:
        """The best valid record of `mod`'s computation measured on THIS target (and device),
        or None. A record stored for another spelling of the computation (the op spec's int32
        for relax's int64) is returned as a record of `mod` itself, and only if its trace
        replays onto `mod`: relax's `MetaScheduleApplyDatabase` replays it onto its own function,
        `query_schedule` onto the record's workload; both then get the same program."""
        tid = self._target_id(target)
        if tid is None:
            return None
        found: list[tuple[RecordRow, Any, bool]] = []
        for wid, wl in self._same(mod):
            exact = structural_equal(wl.mod, mod)
            found += [(r, wl, exact) for r in self.store.best(wid, tid, QUERY_DEPTH)]
        found.sort(key=lambda f: f[0].median_s or 0.0)
        for row, wl, exact in found:
            if exact:
                return self._to_tuning_record(row, wl)
            if _replays(mod, row.trace_json):
                return self._to_tuning_record(row, ms.database.Workload(mod))
        return None


def _replays(mod: Any, trace_json: str) -> bool:
    """Whether a stored trace replays onto `mod` (a trace naming blocks by the names of another
    spelling may not; the tensor intrinsics it names are registered first)."""
    try:
        replay(mod, trace_json)
    except Exception:  # a ScheduleError, a missing block or intrinsic: another record may do
        return False
    return True
