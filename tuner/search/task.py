"""The setup before a job, written once: a workload on a target made ready to tune.

A `ResolvedTask` is a workload registered in the tuning database, its target made canonical and
stored under a device key, and the space name resolved ("default" becomes the template that
applies, or "auto"). It is made once, where a job starts, and handed down:

- `tunefarm tune` (`tuner.cli.tune`) and the search loop for a request without one;
- `POST /v1/jobs` and `POST /v1/models` (`api.resolve.Resolver`, which caches each step);
- a model job, once per task (`tuner.model.job`); its rounds hand the task on to the loop;
- the tuner service, from a stored job's rows (`workers.tuner_service.tune_request`): nothing is
  registered or resolved again.

`TaskResolver` makes it, one step a method, so that a front end may cache a step; a space that
does not apply fails first, before any row is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules import registry
from tuner.core import tvm_api as tv
from tuner.db import Store, TargetRef
from tuner.db.catalog import register_workload
from tuner.workloads import Workload


@dataclass(frozen=True)
class CanonicalTarget:
    """A `tvm.target.Target` with its canonical dict and JSON (what the targets table stores)."""

    target: tv.Target
    as_dict: dict[str, Any]
    json: str

    @classmethod
    def of(cls, spec: tv.Target | str | dict[str, Any]) -> CanonicalTarget:
        """From a target dict, its JSON, "host", or a `tvm.target.Target`."""
        target = spec if isinstance(spec, tv.tvm.target.Target) else tv.make_target(spec)
        return cls(target, tv.target_to_dict(target), tv.canonical_target_json(target))


@dataclass(frozen=True)
class ResolvedTask:
    workload: Workload
    workload_id: int
    target: CanonicalTarget
    target_ref: TargetRef  # the target under its device key
    space: str  # resolved: a template name or "auto"

    @property
    def device_key(self) -> str:
        return self.target_ref.device_key


class TaskResolver:
    """Makes `ResolvedTask`s against one store (subclassed by the API's caching resolver)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def task(self, workload: Workload, target: CanonicalTarget, device_key: str,
             space: str) -> ResolvedTask:
        resolved = self.space(space, workload, target)  # a bad space fails before any row
        return ResolvedTask(workload, self.workload_id(workload), target,
                            self.target_ref(target, device_key), resolved)

    def tasks(self, workloads: list[Workload], target: CanonicalTarget, device_key: str,
              space: str) -> list[ResolvedTask]:
        """The tasks of a model: every space resolved before any row is written."""
        spaces = [self.space(space, wl, target) for wl in workloads]
        tref = self.target_ref(target, device_key)
        return [ResolvedTask(wl, self.workload_id(wl), target, tref, resolved)
                for wl, resolved in zip(workloads, spaces, strict=True)]

    def space(self, name: str, workload: Workload, target: CanonicalTarget) -> str:
        return registry.resolve(name, workload, target.target)

    def workload_id(self, workload: Workload) -> int:
        return register_workload(self.store, workload)

    def target_ref(self, target: CanonicalTarget, device_key: str) -> TargetRef:
        return self.store.ensure_target(target.json, device_key)
