"""Registering what jobs and records refer to: `register_workload` is the one way a workload
row comes to exist (the search loop, the API's resolver and the MetaSchedule adapter all use it).

A workload row stores the canonical spec JSON (`spec_json()`), the structural hash of its module
(16 hex digits, `tuner.core.tvm_api.shash_hex`) and the module itself
(`tuner.core.tvm_api.save_json`), so
that any process can rebuild or match it. Registering is idempotent and race-free: the row of an
existing key is returned unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .store import Store

if TYPE_CHECKING:
    from ..core.tvm_api import IRModule


class Registrable(Protocol):
    """What `register_workload` reads: `tuner.workloads.Workload` is one; the MetaSchedule
    adapter wraps a bare IRModule in another."""

    @property
    def key(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def flops(self) -> int: ...

    def spec_json(self) -> str: ...
    def shash(self) -> str: ...
    def mod(self) -> IRModule: ...


def register_workload(store: Store, wl: Registrable) -> int:
    """The id of the workload's row, inserted if missing (only then is the module built and
    serialized: TVM)."""
    row = store.workload_by_key(wl.key)
    if row is not None:
        return row.id
    from ..core import tvm_api as tv

    return store.ensure_workload(
        key=wl.key, op=wl.op, spec_json=wl.spec_json(), shash=wl.shash(),
        mod_json=tv.save_json(wl.mod()), description=wl.description, flops=int(wl.flops),
        nbytes=tv.param_bytes(wl.mod()))
