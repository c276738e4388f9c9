"""Search spaces: expert templates (`Template`, with their knob tables) and the registry that maps
a workload to its spaces (`schedules.registry`); the table of templates is `schedules/families.py`.

Importing this package loads no template: `TEMPLATES` loads them on first use.
"""

from __future__ import annotations

from schedules.base import Template
from schedules.knobs import Categorical, DesignSpace, Fixed, Knob, PerfectTile, RegisterTile
from schedules.registry import (
    TEMPLATES,
    describe,
    describe_op,
    replay,
    resolve,
    search_strategy,
    space_generator,
    space_names,
    spaces_for,
)

__all__ = ["TEMPLATES", "Categorical", "DesignSpace", "Fixed", "Knob", "PerfectTile",
           "RegisterTile", "Template", "describe", "describe_op", "replay", "resolve",
           "search_strategy", "space_generator", "space_names", "spaces_for"]
