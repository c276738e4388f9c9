"""Which search spaces exist for a workload, and how to build them.

"auto" is MetaSchedule's generated space (post-order-apply over the target's default schedule
rules); it applies to any PrimFunc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.errors import SpecError


@dataclass(frozen=True)
class SpaceInfo:
    name: str
    description: str


SPACES: dict[str, SpaceInfo] = {
    "auto": SpaceInfo("auto", "MetaSchedule's generated space: multi-level tiling, inlining, "
                              "parallel/vectorize/unroll and the target's default rules"),
}


def spaces_for(workload: Any) -> list[str]:
    """Names of the spaces that apply to `workload`, preferred first."""
    return ["auto"]


def space_generator(name: str, workload: Any, target: Any) -> Any:
    """The MetaSchedule SpaceGenerator (or its shorthand) for space `name`."""
    if name not in SPACES:
        raise SpecError(f"unknown space {name!r}; known: {', '.join(SPACES)}", field="space")
    if name not in spaces_for(workload):
        raise SpecError(f"space {name!r} does not apply to {workload.op}", field="space")
    return "post-order-apply"
