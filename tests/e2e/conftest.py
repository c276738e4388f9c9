"""Fixtures of the farm tests that several modules share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TUNEFARM_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out
