"""Which stored workloads a module matches, for `TunefarmDatabase` (`tuner.interop.ms_database`).

Three ways to match, cached per database instance and read again from the store on a miss
(another process may have added a workload since):
- `exact`: the stored module structurally equal to the given one. Records are committed under
  and read back for it: a trace replays onto the module it was recorded on.
- `equal`: every stored module equal under the database's `module_equality`, exactly as TVM's
  `ModuleEquality` decides: "structural" is `exact`; "ignore-tensor" also ignores the contents of
  constant tensors; "anchor-block" compares only the anchor block (the one reduction or
  compute-heavy block of a fused function), so `matmul + relu` and `matmul + add` are equal.
  Hashes under the last two are kept in the `workload_hashes` table, computed the first time a
  database with that equality needs them.
- `same_computation`: every stored module with the same normal form (`tuner.workloads.identity`:
  index dtype, names, attributes), however spelled: relax's int64 legalization of `R.matmul`
  finds the records of `tunefarm tune matmul`.
"""

from __future__ import annotations

from typing import cast

from ..core.tvm_api import IRModule, load_json, ms, shash_hex, structural_equal
from ..workloads.identity import identity_hash, normal_form
from . import ms_queries as q
from .store import Store

MODULE_EQUALITIES = ("structural", "ignore-tensor", "anchor-block")
_HASH_BATCH = 200


def module_hash(mod: IRModule, mode: str) -> str:
    """TVM's hash of `mod` under module equality `mode`, as 16 hex digits (a MemoryDatabase of
    that equality computes it: TVM's own `ModuleEquality`, not a copy of it)."""
    db = ms.database.MemoryDatabase(module_equality=mode)
    return f"{int(db.commit_workload(mod).as_json()[0]):016x}"


def modules_equal(a: IRModule, b: IRModule, mode: str) -> bool:
    """Whether TVM's module equality `mode` holds between `a` and `b`."""
    if mode == "structural":
        return structural_equal(a, b)
    db = ms.database.MemoryDatabase(module_equality=mode)
    db.commit_workload(a)
    return bool(db.has_workload(b))


class WorkloadIndex:
    """The stored workloads of one `Store` as MetaSchedule `Workload`s, found by module."""

    def __init__(self, store: Store, module_equality: str = "structural") -> None:
        if module_equality not in MODULE_EQUALITIES:
            raise ValueError(f"module_equality must be one of {', '.join(MODULE_EQUALITIES)}, "
                             f"not {module_equality!r}")
        self.store = store
        self.mode = module_equality
        self._workloads: dict[int, ms.database.Workload] = {}  # id -> ms Workload (stable identity)
        self._by_shash: dict[str, list[int]] = {}  # shash -> ids whose Workload is cached
        self._by_mode_hash: dict[str, list[int]] = {}  # hash under self.mode -> ids
        self._normal: dict[int, IRModule] = {}  # workload id -> the normal form of its module

    def workload(self, workload_id: int, mod_json: str | None = None) -> ms.database.Workload:
        """The MetaSchedule `Workload` of a stored workload (one object per id)."""
        if workload_id not in self._workloads:
            if mod_json is None:
                row = self.store.get_workload(workload_id)
                if row is None:
                    raise LookupError(f"workload {workload_id} is not in {self.store!r}")
                mod_json = row.mod_json
            # a workload row's module is an IRModule (`register_workload` saves one)
            self._workloads[workload_id] = ms.database.Workload(cast(IRModule, load_json(mod_json)))
        return self._workloads[workload_id]

    def _candidates(self, h: str, *, refresh: bool) -> list[int]:
        if refresh or h not in self._by_shash:
            rows = [r for r in self.store.workload_by_shash(h) if r.mod_json]
            for row in rows:
                self.workload(row.id, row.mod_json)
            self._by_shash[h] = [r.id for r in rows]
        return self._by_shash[h]

    def exact(self, mod: IRModule) -> tuple[int | None, ms.database.Workload | None]:
        """(id, Workload) of the stored module structurally equal to `mod`, or (None, None)."""
        hashes = dict.fromkeys((identity_hash(mod), shash_hex(mod)))  # new rows, then old ones
        for refresh in (False, True):
            for h in hashes:
                for wid in self._candidates(h, refresh=refresh):
                    if structural_equal(self._workloads[wid].mod, mod):
                        return wid, self._workloads[wid]
        return None, None

    def same_computation(self, mod: IRModule) -> list[tuple[int, ms.database.Workload]]:
        """Every stored workload computing what `mod` computes, however spelled."""
        norm = normal_form(mod)
        out: list[tuple[int, ms.database.Workload]] = []
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

    def equal(self, mod: IRModule) -> list[tuple[int, ms.database.Workload]]:
        """Every stored workload equal to `mod` under this index's module equality, oldest
        first (under "structural", the exact one)."""
        if self.mode == "structural":
            wid, wl = self.exact(mod)
            return [] if wid is None else [(wid, cast(ms.database.Workload, wl))]  # set with wid
        h = module_hash(mod, self.mode)
        for refresh in (False, True):
            if refresh or h not in self._by_mode_hash:
                self._hash_new_workloads()
                rows = q.workloads_with_hash(self.store, self.mode, h)
                for row in rows:
                    self.workload(row.id, row.mod_json)
                self._by_mode_hash[h] = [r.id for r in rows]
            out = [(wid, self._workloads[wid]) for wid in self._by_mode_hash[h]
                   if modules_equal(self._workloads[wid].mod, mod, self.mode)]
            if out:
                return out
        return []

    def note_new(self, workload_id: int, mod: IRModule) -> None:
        """A workload was just registered for `mod`: index it under this equality too."""
        if self.mode != "structural":
            q.put_hashes(self.store, self.mode, {workload_id: module_hash(mod, self.mode)})
            self._by_mode_hash.clear()

    def _stored_hash(self, mod_json: str) -> str:
        """The hash of a stored module; "-" (matching nothing) where it cannot be loaded."""
        try:
            return module_hash(cast(IRModule, load_json(mod_json)), self.mode) if mod_json else "-"
        except Exception:  # written by another TVM version: it can match no module of this one
            return "-"

    def _hash_new_workloads(self) -> None:
        """Hash, under this index's equality, the stored workloads that have no hash yet."""
        while rows := q.unhashed_workloads(self.store, self.mode, _HASH_BATCH):
            q.put_hashes(self.store, self.mode, {r.id: self._stored_hash(r.mod_json) for r in rows})
            if len(rows) < _HASH_BATCH:
                return
