"""`TunefarmDatabase`: a MetaSchedule database backed by the tunefarm SQL `Store`.

It lets `ms.tir_integration.compile_tir(db, mod, target)`, `ms.tune_tir(..., database=db)` and
`relax.transform.MetaScheduleApplyDatabase` work against SQLite / PostgreSQL, and keeps the
contract of TVM's built-in databases (`tests/tuner/test_ms_database_contract.py` checks it):
- every record committed is kept as committed (run_secs verbatim, None and [] included; the
  same record twice is two records), and `get_all_tuning_records` returns them in commit order;
- a record is valid as in TVM (`TuningRecord.IsValid`): its trace has an instruction before
  postprocessing and one of its run_secs is not the 1e10 failure placeholder; `get_top_k` ranks
  valid records by their mean run time, ties in commit order, and refuses a negative `top_k`;
- `module_equality` is TVM's: "structural", "ignore-tensor" or "anchor-block"
  (`tuner.db.ms_lookup`).

Where it differs from TVM's databases on purpose, each difference has an option that turns it
off (docs/compiler.md, "From a compiler pipeline"):
- queries answer per target (`any_target=True`: the best record of any target, as TVM);
- queries also find other spellings of the same computation, such as relax's int64
  legalization of an op spec (`same_computation=False`: module equality only);
- reads are scoped to one device key, and to one target when bound to it (`device_key=None`:
  every device);
- `ranking="median"` ranks by the median run time, as tunefarm's own views do (default "mean").
Arbitrary modules are stored under the key `tir-<identity hash>` (`-<n>` for another spelling of
the same computation) with op "tir".
"""

from __future__ import annotations

import hashlib
import json
import statistics
import uuid
from dataclasses import dataclass
from typing import Any

from schedules.intrinsics import register_for_trace
from schedules.registry import replay
from tuner.core.tvm_api import (
    IRModule,
    Schedule,
    Target,
    Trace,
    canonical_target_json,
    derived_object,
    load_tensor_intrins,
    ms,
    shash_hex,
    structural_equal,
    trace_decisions,
    trace_to_json,
    tvm,
    tvm_version,
)
from tuner.db import ms_queries as q
from tuner.db.catalog import register_workload
from tuner.db.engine import target_key
from tuner.db.ms_lookup import MODULE_EQUALITIES, WorkloadIndex
from tuner.db.rows import NewRecord, RecordRow, TargetRef
from tuner.db.store import Store
from tuner.measure import Invalidity
from tuner.workloads import canonical_json
from tuner.workloads.identity import identity_hash

FAILED_RUN_S = 1e10  # MetaSchedule's placeholder for a run that gave no time
QUERY_DEPTH = 5  # records per stored module tried when a trace must replay onto another
MS_SPACE = "metaschedule"

__all__ = ["FAILED_RUN_S", "MODULE_EQUALITIES", "MS_SPACE", "TunefarmDatabase", "shash_hex"]


@dataclass(frozen=True)
class _BareModule:
    """A module committed through MetaSchedule, as `register_workload` takes it: key
    `tir-<shash>` (or `tir-<shash>-<n>` on a hash collision), op "tir"."""

    key: str
    module: IRModule
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

    def mod(self) -> IRModule:
        return self.module


def _target_jsons(target: Target) -> list[str]:
    """Canonical JSON of `target`, then of the same target without its host (a relax build
    attaches the host; records are stored for the bare target)."""
    exact = canonical_target_json(target)
    d = json.loads(exact)
    if "host" not in d:
        return [exact]
    d.pop("host")
    return [exact, json.dumps(d, sort_keys=True, separators=(",", ":"))]


def _estimate_flops(mod: IRModule) -> int:
    try:
        return int(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # dynamic shapes, unsupported ops: the count is informational only
        return 0


def _trace_is_valid(trace: Trace) -> bool:
    """TVM's rule: the trace has an instruction before postprocessing starts."""
    insts = list(trace.insts)
    return bool(insts) and insts[0].kind.name != "EnterPostproc"


def _runs_are_valid(run_secs: list[float] | None) -> bool:
    """TVM's rule: some run time is not the failure placeholder."""
    return any(s != FAILED_RUN_S for s in run_secs or [])


@derived_object
class TunefarmDatabase(ms.database.PyDatabase):
    """A MetaSchedule `Database` over a tunefarm `Store` (a Store, a URL, or None: settings).

    `device_key` completes the target identity (the same target JSON on two boards is two
    targets): records are committed for it, and `get_top_k`, `get_all_tuning_records`,
    `__len__` and the queries read only its targets (`None`: every device key; commits then go
    to "local"). With `target` given, those reads see only that target's records (what a tuning
    run wants), and a record committed without a target is stored for it.
    `module_equality`, `ranking`, `same_computation` and `any_target`: the module docstring.
    """

    def __init__(self, store: Store | str | None = None, device_key: str | None = "local", *,
                 target: Target | None = None, module_equality: str = "structural",
                 ranking: q.Ranking = "mean", same_computation: bool = True,
                 any_target: bool = False) -> None:
        super().__init__()
        load_tensor_intrins("x86")  # a caller's own ms.tune_tir: its default CPU rules name them
        if ranking not in q.RANKINGS:
            raise ValueError(f"ranking must be one of {', '.join(q.RANKINGS)}, not {ranking!r}")
        self.store = store if isinstance(store, Store) else Store(store)
        self.index = WorkloadIndex(self.store, module_equality)
        self.module_equality = module_equality
        self.device_key = device_key
        self.ranking: q.Ranking = ranking
        self.same_computation = same_computation
        self.any_target = any_target
        self._targets: dict[int, dict[str, Any]] = {}  # target id -> target JSON dict
        self.target_id: int | None = None
        if target is not None:
            self.target_id = self._ensure_target(target).id

    # --- helpers ---------------------------------------------------------------------------

    def _ensure_target(self, target: Target) -> TargetRef:
        return self.store.ensure_target(canonical_target_json(target), self.device_key or "local")

    def _target_id(self, target: Target) -> int | None:
        for tj in _target_jsons(target):
            ref = self.store.target_by_key(target_key(tj, self.device_key or "local"))
            if ref is not None:
                return ref.id
        return None

    def _target(self, target_id: int) -> dict[str, Any]:
        if target_id not in self._targets:
            ref = self.store.get_target(target_id)
            if ref is None:
                raise LookupError(f"target {target_id} is not in {self.store!r}")
            self._targets[target_id] = json.loads(ref.target_json)
        return self._targets[target_id]

    def _records(self, workload_ids: list[int] | None, *, ranked: bool,
                 limit: int | None = None, target_id: int | None = None) -> list[RecordRow]:
        return q.scoped_records(self.store, workload_ids=workload_ids,
                                target_id=target_id if target_id is not None else self.target_id,
                                device_key=self.device_key, limit=limit,
                                ranking=self.ranking if ranked else None)

    def _rank(self, row: RecordRow) -> float:
        value = row.mean_s if self.ranking == "mean" else row.median_s
        return float("inf") if value is None else value

    def _to_tuning_record(self, row: RecordRow,
                          workload: ms.database.Workload) -> ms.database.TuningRecord:
        register_for_trace(row.trace_json)  # the caller replays it: its intrinsics must exist
        args_info = ms.arg_info.ArgInfo.from_entry_func(workload.mod, remove_preproc=True)
        run_secs = None if row.latencies is None else [float(x) for x in row.latencies]
        if row.space != MS_SPACE and not row.ok:  # tunefarm measured it: wrong answer, crash...
            run_secs = [FAILED_RUN_S]  # whatever its samples, no database may take it as valid
        return ms.database.TuningRecord.from_json(
            [json.loads(row.trace_json), run_secs, self._target(row.target_id),
             [a.as_json() for a in args_info]],
            workload)

    # --- the PyDatabase interface ----------------------------------------------------------

    def has_workload(self, mod: IRModule) -> bool:
        """Whether a stored workload equals `mod` under the module equality (or, with
        `same_computation`, computes what it computes)."""
        return bool(self.index.equal(mod)
                    or (self.same_computation and self.index.same_computation(mod)))

    def commit_workload(self, mod: IRModule) -> ms.database.Workload:
        """The stored workload equal to `mod` under the module equality, stored if none is."""
        found = self.index.equal(mod)
        if found:
            return found[0][1]
        return self.index.workload(self._register(mod))

    def _register(self, mod: IRModule) -> int:
        wid, _ = self.index.exact(mod)
        if wid is not None:
            return wid
        shash = identity_hash(mod)
        taken = {row.key for row in self.store.workload_by_shash(shash)}
        key, n = f"tir-{shash}", 0
        while key in taken:  # another spelling of the computation, or a hash collision
            n += 1
            key = f"tir-{shash}-{n}"
        wid = register_workload(self.store, _BareModule(key, mod, shash, _estimate_flops(mod)))
        self.index.note_new(wid, mod)
        found, _ = self.index.exact(mod)
        if found is None:
            raise LookupError("the committed workload is not found again")
        return found

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        """Store the record as given, under the stored module its trace was recorded on."""
        self._commit(record, f"ms-{uuid.uuid4().hex}")

    def import_record(self, record: ms.database.TuningRecord) -> bool:
        """Commit a record read from elsewhere (`tunefarm db import`) unless the same
        measurement (workload, target, candidate, median) is stored already, under any trial
        id; whether it was added."""
        return self._commit(record, None)

    def _commit(self, record: ms.database.TuningRecord, trial_id: str | None) -> bool:
        wid = self._register(record.workload.mod)
        if record.target is not None:
            tid = self._ensure_target(record.target).id
        elif self.target_id is not None:
            tid = self.target_id
        else:
            raise ValueError("the tuning record has no target and the database is not bound to one")
        secs = None if record.run_secs is None else [float(s) for s in record.run_secs]
        valid = _trace_is_valid(record.trace) and _runs_are_valid(secs)
        times = [s for s in secs or [] if s != FAILED_RUN_S]  # tunefarm's statistics: real runs
        median = statistics.median(times) if valid else None
        cv = (statistics.pstdev(times) / statistics.fmean(times)
              if valid and statistics.fmean(times) > 0 else None)
        trace_json = trace_to_json(record.trace)
        imported = trial_id is None
        if trial_id is None:
            digest = hashlib.sha256(f"{wid}|{tid}|{trace_json}|{secs}".encode()).hexdigest()
            trial_id = f"ms-import-{digest[:40]}"
        new = NewRecord(
            trial_id=trial_id, workload_id=wid, target_id=tid, space=MS_SPACE,
            cand_hash=_cand_hash(record, trace_json), trace_json=trace_json,
            decisions=trace_decisions(record.trace), latencies=secs, median_s=median, cv=cv,
            invalidity=Invalidity.OK if valid else Invalidity.RUN_ERROR,
            error_msg=None if valid else _why_invalid(record.trace, secs),
            tvm_version=tvm_version())
        if imported and self.store.has_measurement(new):
            return False  # this very measurement, stored under another trial id
        return bool(self.store.add_records([new]))

    def get_top_k(self, workload: ms.database.Workload,
                  top_k: int) -> list[ms.database.TuningRecord]:
        """The `top_k` fastest valid records of the workloads equal to `workload`."""
        if top_k < 0:
            raise ValueError(f"top_k must be non-negative, not {top_k}")
        found = self.index.equal(workload.mod)
        if top_k == 0 or not found:
            return []
        wls = dict(found)
        return [self._to_tuning_record(r, wls[r.workload_id])
                for r in self._records(list(wls), ranked=True, limit=top_k)]

    def get_all_tuning_records(self) -> list[ms.database.TuningRecord]:
        return [self._to_tuning_record(r, self.index.workload(r.workload_id))
                for r in self._records(None, ranked=False)]

    def __len__(self) -> int:
        return q.count_scoped(self.store, target_id=self.target_id, device_key=self.device_key)

    def query_tuning_record(self, mod: IRModule, target: Target,
                            workload_name: str | None = None) -> ms.database.TuningRecord | None:
        """The best valid record for `mod` on THIS target (and device), or None.

        A record of `mod` itself, or of a stored module that differs only in how it is spelled
        or in its constants, is returned as a record of `mod` when its trace replays onto `mod`.
        Under "anchor-block", a record of a module with the same anchor block whose trace does
        not replay is returned with its own workload, as TVM's databases do: relax's
        `MetaScheduleApplyDatabase` then schedules `mod` with it as an anchor trace."""
        tid = None if self.any_target else self._target_id(target)
        if tid is None and not self.any_target:
            return None
        kinds: dict[int, tuple[ms.database.Workload, str]] = {}
        for wid, wl in self.index.equal(mod):
            kinds[wid] = (wl, "equal")
        if self.same_computation:
            for wid, wl in self.index.same_computation(mod):
                kinds.setdefault(wid, (wl, "spelling"))
        found: list[tuple[RecordRow, ms.database.Workload, str]] = []
        for wid, (wl, kind) in kinds.items():
            found += [(r, wl, kind)
                      for r in self._records([wid], ranked=True, limit=QUERY_DEPTH, target_id=tid)]
        found.sort(key=lambda f: (self._rank(f[0]), f[0].id))
        for row, wl, kind in found:
            if structural_equal(wl.mod, mod):
                return self._to_tuning_record(row, wl)
            if _replays(mod, row.trace_json):
                return self._to_tuning_record(row, ms.database.Workload(mod))
            if kind == "equal" and self.module_equality == "anchor-block" and _anchor_applies(
                    mod, wl, row.trace_json, target):
                return self._to_tuning_record(row, wl)
        return None

    def query_schedule(self, mod: IRModule, target: Target,
                       workload_name: str | None = None) -> Schedule | None:
        """The schedule of `mod` from `query_tuning_record`'s record: its trace replayed, or,
        for a record of another module with the same anchor block, applied as an anchor trace
        (TVM's default would return a schedule of the record's module)."""
        rec = self.query_tuning_record(mod, target, workload_name)
        if rec is None:
            return None
        if structural_equal(rec.workload.mod, mod):
            sch = Schedule(rec.workload.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
        else:
            sch = Schedule(mod)
            ms.trace_apply.schedule_using_anchor_trace(sch, rec.trace, tvm.target.Target(target))
        return sch

    def query_ir_module(self, mod: IRModule, target: Target,
                        workload_name: str | None = None) -> IRModule | None:
        sch = self.query_schedule(mod, target, workload_name)
        return None if sch is None else sch.mod


def _cand_hash(record: ms.database.TuningRecord, trace_json: str) -> str:
    """The candidate's program hash; the trace's where it does not replay (a record may hold
    a trace that no longer applies: it is kept all the same)."""
    try:
        return shash_hex(record.as_measure_candidate().sch.mod)
    except Exception:
        return hashlib.sha256(trace_json.encode()).hexdigest()[:16]


def _why_invalid(trace: Trace, secs: list[float] | None) -> str:
    if not _trace_is_valid(trace):
        return "MetaSchedule record with an empty trace"
    if secs is None:
        return "MetaSchedule record without run times"
    return "MetaSchedule reported a failed run" if secs else "MetaSchedule record with no runs"


def _anchor_applies(mod: IRModule, recorded_on: ms.database.Workload, trace_json: str,
                    target: Target) -> bool:
    """Whether a trace stored for workload `recorded_on` schedules `mod` as an anchor trace
    (relax would abort the build on one that does not)."""
    try:
        register_for_trace(trace_json)
        trace = ms.database.TuningRecord.from_json(
            [json.loads(trace_json), None, None, None], recorded_on).trace
        ms.trace_apply.schedule_using_anchor_trace(Schedule(mod), trace, tvm.target.Target(target))
    except Exception:  # a ScheduleError or a failed check inside TVM: not this record
        return False
    return True


def _replays(mod: IRModule, trace_json: str) -> bool:
    """Whether a stored trace replays onto `mod` (a trace naming blocks by the names of another
    spelling may not; the tensor intrinsics it names are registered first)."""
    try:
        replay(mod, trace_json)
    except Exception:  # a ScheduleError, a missing block or intrinsic: another record may do
        return False
    return True
