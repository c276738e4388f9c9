"""docs/templates.md is the template table the registry reads (`schedules.catalogue`)."""

from __future__ import annotations

from pathlib import Path

from schedules.catalogue import markdown
from schedules.families import FAMILIES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "templates.md"


def test_the_catalogue_page_is_generated_from_the_families() -> None:
    assert PAGE.read_text() == markdown(), (
        "docs/templates.md is out of date: python -m schedules.catalogue > docs/templates.md")


def test_every_family_has_a_row_with_its_targets_and_knobs() -> None:
    rows = [ln for ln in markdown().splitlines() if ln.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [t.name for t in FAMILIES]
    for t, row in zip(FAMILIES, rows, strict=True):
        assert t.target and t.target in row, t.name
        assert all(f"`{k}`" in row for k in t.KNOBS), t.name
