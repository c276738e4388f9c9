"""Which search spaces exist for a workload, and how to build them.

- a template name (one of the classes listed in `schedules/families.py`): an expert space;
- "auto": MetaSchedule's generated space (post-order-apply over the target's default rules), for
  any PrimFunc;
- "default": the first template that applies, else "auto".

`TEMPLATES` (name -> template) loads the table of families on first use, so that `replay`, all a
build or measuring process needs, imports no template.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from schedules import naming
from schedules.base import Template
from schedules.naming import KnobNamer
from tuner.core.errors import SpecError
from tuner.workloads import Workload

if TYPE_CHECKING:
    from tuner.core.tvm_api import IRModule, Schedule, Target, Trace, ms

AUTO = {"name": "auto", "kind": "generated", "ops": ["*"],
        "description": "MetaSchedule's generated space: multi-level tiling, inlining, "
                       "parallel/vectorize/unroll and the target's default rules", "knobs": {}}


class _Templates(Mapping[str, Template]):
    """One instance of each class of `schedules.families.FAMILIES` by name, in table order;
    imports the families on first use."""

    def __init__(self) -> None:
        self._by_name: dict[str, Template] | None = None

    def _load(self) -> dict[str, Template]:
        if self._by_name is None:
            from schedules.families import FAMILIES

            by_name: dict[str, Template] = {}
            for cls in FAMILIES:
                inst = cls()
                if not inst.name or inst.name in by_name or inst.name in ("auto", "default"):
                    raise ValueError(f"bad or duplicate template name {inst.name!r}")
                by_name[inst.name] = inst
            self._by_name = by_name
        return self._by_name

    def __getitem__(self, name: str) -> Template:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


TEMPLATES: Mapping[str, Template] = _Templates()


def replay(mod: IRModule, trace_json: str) -> Schedule:
    """A stored trace (JSON) replayed onto a fresh schedule of `mod`, in any process: registers
    the tensor intrinsics the trace names first (schedules/intrinsics.py). Every replay of a
    record goes through here."""
    from schedules.intrinsics import register_for_trace
    from tuner.core.tvm_api import apply_trace

    register_for_trace(trace_json)
    return apply_trace(mod, trace_json)


def _load() -> None:
    """Load the template table now (`TEMPLATES` also loads it on first use)."""
    len(TEMPLATES)


def space_names() -> list[str]:
    return [*TEMPLATES, "auto", "default"]


def spaces_for(workload: Workload, target: Target) -> list[str]:
    """Names of the spaces that apply to `workload` on `target`, preferred first."""
    return [n for n, t in TEMPLATES.items() if t.applies(workload, target)] + ["auto"]


def resolve(name: str, workload: Workload, target: Target) -> str:
    """The concrete space name: "default" becomes the preferred space that generates a design
    space for the workload (a template that matches but fails on it, e.g. on an intermediate
    buffer it cannot inline, gives way to the next, and at last to "auto"); others are
    checked."""
    if name == "default":
        return next(n for n in spaces_for(workload, target)
                    if n == "auto" or generates(n, workload, target))
    if name != "auto" and name not in TEMPLATES:
        raise SpecError(f"unknown space {name!r}; known: {', '.join(space_names())}", field="space")
    if name not in spaces_for(workload, target):
        raise SpecError(f"space {name!r} does not apply to {workload.op} on this target; "
                        f"applicable: {', '.join(spaces_for(workload, target))}", field="space")
    return name


_GENERATES: dict[tuple[str, str, str], bool] = {}


def _design_spaces(name: str, workload: Workload, target: Target) -> list[Schedule]:
    """Template `name`'s design spaces of `workload` on `target`, as MetaSchedule makes them."""
    from tuner.core import tvm_api as tv

    ctx = tv.tune_context(workload.mod(), target, space=TEMPLATES[name].space(workload, target),
                          strategy=search_strategy(name), seed=0, num_threads=1)
    return list(tv.design_spaces(ctx))


def generates(name: str, workload: Workload, target: Target) -> bool:
    """Whether template `name` generates a design space for `workload` on `target` (cached)."""
    key = (name, workload.key, str(target))
    if key not in _GENERATES:
        try:
            _GENERATES[key] = bool(_design_spaces(name, workload, target))
        except (SpecError, RuntimeError, ValueError):
            _GENERATES[key] = False
        if len(_GENERATES) > 4096:
            _GENERATES.pop(next(iter(_GENERATES)))
    return _GENERATES[key]


def space_generator(name: str, workload: Workload,
                    target: Target) -> ms.SpaceGenerator | Literal["post-order-apply"]:
    """The MetaSchedule SpaceGenerator (or its shorthand) for space `name`, already resolved
    (`resolve`, once per job: `tuner.search.task`); "default" is resolved here."""
    if name == "default":
        name = resolve(name, workload, target)
    if name == "auto":
        return "post-order-apply"
    return TEMPLATES[name].space(workload, target)


_NAMERS: dict[tuple[str, str, str], KnobNamer] = {}


def knob_namer(name: str, workload: Workload, target: Target) -> KnobNamer:
    """Names the knob values of space `name`'s candidates for `workload` on `target` (cached):
    the template's design spaces generated once while their knob names are noted
    (schedules/naming.py); "auto" and a space that fails to generate name knobs by position."""
    if name == "default":
        name = resolve(name, workload, target)
    key = (name, workload.key, str(target))
    if key not in _NAMERS:
        spaces: list[tuple[str, list[str]]] = []
        if name != "auto":
            from tuner.core import tvm_api as tv

            try:
                with naming.recording() as notes:
                    designs = _design_spaces(name, workload, target)
                spaces = [(naming.signature(naming.samples(tv.trace_to_json(
                    cast("Trace", d.trace)))), names)  # design spaces are traced
                          for d, names in zip(designs, notes, strict=True)]
            except (SpecError, RuntimeError, ValueError):
                spaces = []
        _NAMERS[key] = KnobNamer(spaces)
        if len(_NAMERS) > 1024:
            _NAMERS.pop(next(iter(_NAMERS)))
    return _NAMERS[key]


def search_strategy(name: str) -> ms.search_strategy.EvolutionarySearch:
    """The evolutionary search for space `name` (already resolved), sized for that space."""
    from tuner.core.tvm_api import ms

    if name == "auto":  # MetaSchedule's defaults for its generated space
        pop, iters = 512, 4
    else:
        pop, iters = TEMPLATES[name].population_size, TEMPLATES[name].genetic_iters
    return ms.search_strategy.EvolutionarySearch(population_size=pop, genetic_num_iters=iters,
                                                 init_min_unmeasured=min(50, pop // 2))


def describe(name: str, workload: Workload | None = None) -> dict[str, Any]:
    """A space as JSON: its kind, the ops it serves, its knobs and their ranges."""
    if name == "auto":
        return dict(AUTO)
    if name not in TEMPLATES:
        raise SpecError(f"unknown space {name!r}; known: {', '.join(space_names())}", field="space")
    return TEMPLATES[name].describe(workload)


def explain(workload: Workload, target: Target) -> list[dict[str, Any]]:
    """Every template for `workload` on `target`: whether it applies, and why not; then auto."""
    out = []
    for name, t in TEMPLATES.items():
        why = t.why_not(workload, target)
        out.append({"name": name, "applies": why is None, "reason": why,
                    **({"knobs": t.knobs(workload)} if why is None else {})})
    return [*out, {"name": "auto", "applies": True, "reason": None}]


def describe_op(op: str) -> list[dict[str, Any]]:
    """Every space that can serve `op` (templates first, then auto)."""
    return [t.describe() for t in TEMPLATES.values() if op in t.ops] + [dict(AUTO)]
