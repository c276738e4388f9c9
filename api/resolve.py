"""Request values -> validated, canonical objects, memoized per process.

Parsing a workload spec, canonicalizing a target (TVM) and resolving a search space cost from
microseconds to milliseconds (the first `resolve` loads every template: ~1 s), so the API keeps
small LRU maps from the raw request values to their results. GET /v1/best with a warm cache then
does no TVM work at all: (workload, target, device_key) as sent -> (workload_key, target_key).

A TVMScript (`tir`) spec the resolver has not parsed yet costs a parse child: with a principal
(`who`) it is parsed inside the API's parse gate and that principal's parse budget
(`api.parsegate`); GET /v1/best parses one only for user tokens (a worker asks by key).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from schedules import registry
from tuner.core import tvm_api as tv
from tuner.core.errors import Forbidden, NotFound, SpecError
from tuner.core.targets import check_target
from tuner.db.engine import target_key
from tuner.db.rows import TargetRef
from tuner.db.store import Store
from tuner.search.task import CanonicalTarget, TaskResolver
from tuner.workloads import Workload, parse_spec

from .parsegate import ParseGate

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small thread-safe LRU map (the thread pool runs sync routes concurrently)."""

    def __init__(self, max_entries: int = 2048) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> V:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
        return value

    def get_or(self, key: K, make: Callable[[], V]) -> V:
        value = self.get(key)
        return value if value is not None else self.put(key, make())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


@dataclass(frozen=True)
class BestKey:
    """What GET /v1/best needs, resolved from its raw query values."""

    workload: Workload
    target: CanonicalTarget
    device_key: str
    target_key: str

    @property
    def workload_key(self) -> str:
        return self.workload.key


def _is_tir(spec: object) -> bool:
    return isinstance(spec, dict) and spec.get("op") == "tir"


def _digest(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Resolver(TaskResolver):
    """The API's `TaskResolver`: each step of a job's setup memoized, and the request values
    (a workload spec, a target) parsed and checked once."""

    def __init__(self, store: Store, gate: ParseGate | None = None) -> None:
        super().__init__(store)
        self.gate = gate or ParseGate(slots=2, queue=8, wait_s=10.0, per_min=0)
        self._workloads: LRU[str, Workload] = LRU(1024)
        self._targets: LRU[str, CanonicalTarget] = LRU(256)
        self._spaces: LRU[tuple[str, str, str], str] = LRU(4096)
        self._workload_ids: LRU[str, int] = LRU(4096)
        self._target_refs: LRU[tuple[str, str], TargetRef] = LRU(1024)
        self._target_keys: LRU[int, TargetRef] = LRU(1024)
        self._best: LRU[tuple[str, str, str], BestKey] = LRU(8192)

    def warm_up(self) -> None:
        """Load the schedule templates now rather than on the first request (~1 s)."""
        registry.space_names()

    # --- request values ---------------------------------------------------------------------

    def knows(self, spec: dict[str, Any]) -> bool:
        """Whether `spec` needs no parse child: parsed before, or not TVMScript."""
        return not _is_tir(spec) or self._workloads.get(_digest(spec)) is not None

    def workload(self, spec: dict[str, Any], who: str | None = None) -> Workload:
        """The workload of a request's spec; a new TVMScript text for principal `who` is
        parsed inside the parse gate and `who`'s budget (429 when either is spent)."""
        digest = _digest(spec)
        hit = self._workloads.get(digest)
        if hit is not None:
            return hit
        if who is None or not _is_tir(spec):
            return self._workloads.put(digest, parse_spec(spec))
        with self.gate.admit(who):
            return self._workloads.put(digest, parse_spec(spec))

    def target(self, spec: str | dict[str, Any]) -> CanonicalTarget:
        """A target from a request: "host" (this API's CPU), or a dict (or its JSON text) that
        passes the allowlist (`tuner.core.targets.check_target`) and then TVM."""
        def make() -> CanonicalTarget:
            value: Any = spec
            if isinstance(value, str) and value.strip().startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):  # make_target names the error
                    value = json.loads(value)
            if isinstance(value, dict):
                check_target(value)
            return CanonicalTarget.of(tv.make_target(value))

        raw = spec.strip() if isinstance(spec, str) else spec
        return self._targets.get_or(_digest(raw), make)

    def space(self, name: str, workload: Workload, target: CanonicalTarget) -> str:
        return self._spaces.get_or((name, workload.key, target.json),
                                   lambda: super(Resolver, self).space(name, workload, target))

    # --- SQL ids ----------------------------------------------------------------------------

    def workload_id(self, workload: Workload) -> int:
        return self._workload_ids.get_or(
            workload.key, lambda: super(Resolver, self).workload_id(workload))

    def target_ref(self, target: CanonicalTarget, device_key: str) -> TargetRef:
        return self._target_refs.get_or(
            (target.json, device_key), lambda: super(Resolver, self).target_ref(target, device_key))

    def target_by_id(self, target_id: int) -> TargetRef | None:
        ref = self._target_keys.get(target_id)
        if ref is None:
            ref = self.store.get_target(target_id)
            if ref is not None:
                self._target_keys.put(target_id, ref)
        return ref

    # --- GET /v1/best -----------------------------------------------------------------------

    def cached_best_key(self, workload: str, target: str, device_key: str) -> BestKey | None:
        return self._best.get((workload, target, device_key))

    def best_key(self, workload: str, target: str, device_key: str,
                 who: str | None = None) -> BestKey:
        """Resolve the raw query values of GET /v1/best (a workload key or JSON spec; "host" or a
        JSON target). Unknown workload keys are not remembered: they may be tuned later. A new
        TVMScript spec is parsed for a user `who` only (None: a worker, which asks by key)."""
        hit = self._best.get((workload, target, device_key))
        if hit is not None:
            return hit
        wl = self._workload_from_query(workload, who)
        tgt = self.target(target)
        key = BestKey(wl, tgt, device_key, target_key(tgt.json, device_key))
        return self._best.put((workload, target, device_key), key)

    def _workload_from_query(self, text: str, who: str | None) -> Workload:
        text = text.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SpecError(f"not valid JSON: {exc.msg}", field="workload") from exc
            if not isinstance(spec, dict):
                raise SpecError("a workload spec is a JSON object", field="workload")
            if who is None and not self.knows(spec):
                raise Forbidden("a worker token asks for a TVMScript workload by its key "
                                "(e.g. tir-0123456789abcdef), not by its text")
            return self.workload(spec, who)
        row = self.store.workload_by_key(text)
        if row is None:
            raise NotFound(f"no workload with key {text!r} has been tuned here; pass the workload "
                           "spec as JSON instead of a key")
        return self.workload(json.loads(row.spec_json))
