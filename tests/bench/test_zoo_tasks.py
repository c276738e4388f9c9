"""`python -m bench tasks`: each zoo model's tasks and the space a model job gives each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_task_table_names_a_space_for_every_task_and_counts_them(tmp_path: Path) -> None:
    from bench.zoo_tasks import main
    from schedules.registry import space_names

    assert main(["--scale", "small", "--only", "custom-cnn", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "tasks.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (\d+) \| ([\d.]+) \| (.+) \|$", text, re.M)
    assert rows, text
    spaces = [space for *_, space in rows]
    known = set(space_names())
    assert all(s in known or s.startswith("default schedule (") for s in spaces), spaces
    assert any(s.startswith("conv2d") for s in spaces), spaces  # a CNN's convolutions: a template
    (summary,) = re.findall(r"^\| custom-cnn \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", text, re.M)
    total, template, auto, default = map(int, summary)
    assert total == len(rows) == template + auto + default
    assert auto == spaces.count("auto") and template == sum(s in known - {"auto"} for s in spaces)
