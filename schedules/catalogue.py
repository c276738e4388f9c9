"""The template catalogue: `FAMILIES` as the Markdown table of docs/templates.md.

`python -m schedules.catalogue` prints the page; `tests/schedules/test_catalogue.py` checks the
page in the repository is this text, so the catalogue a user reads is the table the registry
reads (name, what a template serves and how it is matched, its targets, its knobs).
"""

from __future__ import annotations

from schedules.base import StructuralTemplate, Template
from schedules.families import FAMILIES

HEADER = """# The template catalogue

Every expert template tunefarm ships, in the order the `default` space tries them (the first
that applies to a workload is its space; none: MetaSchedule's generated space, `auto`). A
template "by structure" is matched by the blocks of any PrimFunc (a `tir` workload, a model's
task); the others by op name. `tunefarm spaces` shows which apply to a workload and why not,
with each knob's values.

Generated from `schedules/families.py` by `python -m schedules.catalogue > docs/templates.md`;
a test checks this page is up to date.

| template | serves | targets | knobs | what it does |
|---|---|---|---|---|
"""


def _serves(t: type[Template]) -> str:
    ops = [op for op in t.ops if op != "tir"]
    if issubclass(t, StructuralTemplate) or "tir" in t.ops:
        return ", ".join(f"`{op}`" for op in ops) + (" and " if ops else "") + "by structure"
    return ", ".join(f"`{op}`" for op in ops)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown() -> str:
    """The catalogue page: its header, then one row per template family."""
    rows = [f"| `{t.name}` | {_serves(t)} | {_cell(t.target)} | "
            f"{', '.join(f'`{k}`' for k in t.KNOBS)} | {_cell(t.description)} |"
            for t in FAMILIES]
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
