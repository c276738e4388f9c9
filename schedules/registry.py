"""Which search spaces exist for a workload, and how to build them.

- a template name (`schedules/<family>.py`, registered with `@register`): an expert space;
- "auto": MetaSchedule's generated space (post-order-apply over the target's default rules), for
  any PrimFunc;
- "default": the first template that applies, else "auto".
"""

from __future__ import annotations

from typing import Any

from schedules.base import Template
from tuner.errors import SpecError

TEMPLATES: dict[str, Template] = {}

AUTO = {"name": "auto", "kind": "generated", "ops": ["*"],
        "description": "MetaSchedule's generated space: multi-level tiling, inlining, "
                       "parallel/vectorize/unroll and the target's default rules", "knobs": {}}


def register(cls: type[Template]) -> type[Template]:
    inst = cls()
    if not inst.name or inst.name in TEMPLATES or inst.name in ("auto", "default"):
        raise ValueError(f"bad or duplicate template name {inst.name!r}")
    TEMPLATES[inst.name] = inst
    return cls


def replay(mod: Any, trace_json: str) -> Any:
    """A stored trace (JSON) replayed onto a fresh schedule of `mod`, in any process: registers
    the tensor intrinsics the trace names first (schedules/intrinsics.py). Every replay of a
    record goes through here."""
    from schedules.intrinsics import register_for_trace
    from tuner.tvm_api import apply_trace

    register_for_trace(trace_json)
    return apply_trace(mod, trace_json)


def _load() -> None:
    # importing the families registers them
    from schedules import families  # noqa: F401


def space_names() -> list[str]:
    _load()
    return [*TEMPLATES, "auto", "default"]


def spaces_for(workload: Any, target: Any) -> list[str]:
    """Names of the spaces that apply to `workload` on `target`, preferred first."""
    _load()
    return [n for n, t in TEMPLATES.items() if t.applies(workload, target)] + ["auto"]


def resolve(name: str, workload: Any, target: Any) -> str:
    """The concrete space name: "default" becomes the preferred space; others are checked."""
    _load()
    if name == "default":
        return spaces_for(workload, target)[0]
    if name != "auto" and name not in TEMPLATES:
        raise SpecError(f"unknown space {name!r}; known: {', '.join(space_names())}", field="space")
    if name not in spaces_for(workload, target):
        raise SpecError(f"space {name!r} does not apply to {workload.op} on this target; "
                        f"applicable: {', '.join(spaces_for(workload, target))}", field="space")
    return name


def space_generator(name: str, workload: Any, target: Any) -> Any:
    """The MetaSchedule SpaceGenerator (or its shorthand) for space `name` (already resolved)."""
    name = resolve(name, workload, target)
    if name == "auto":
        return "post-order-apply"
    return TEMPLATES[name].space(workload, target)


def search_strategy(name: str) -> Any:
    """The evolutionary search for space `name` (already resolved), sized for that space."""
    from tuner.tvm_api import ms

    if name == "auto":  # MetaSchedule's defaults for its generated space
        pop, iters = 512, 4
    else:
        pop, iters = TEMPLATES[name].population_size, TEMPLATES[name].genetic_iters
    return ms.search_strategy.EvolutionarySearch(population_size=pop, genetic_num_iters=iters,
                                                 init_min_unmeasured=min(50, pop // 2))


def describe(name: str, workload: Any | None = None) -> dict[str, Any]:
    """A space as JSON: its kind, the ops it serves, its knobs and their ranges."""
    _load()
    if name == "auto":
        return dict(AUTO)
    if name not in TEMPLATES:
        raise SpecError(f"unknown space {name!r}; known: {', '.join(space_names())}", field="space")
    return TEMPLATES[name].describe(workload)


def describe_op(op: str) -> list[dict[str, Any]]:
    """Every space that can serve `op` (templates first, then auto)."""
    _load()
    return [t.describe() for t in TEMPLATES.values() if op in t.ops] + [dict(AUTO)]
