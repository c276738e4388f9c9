"""Imports every template family so that `@register` runs (see schedules/registry.py)."""

from __future__ import annotations

from schedules import gemm  # noqa: F401
from schedules import conv  # noqa: F401
from schedules import int8  # noqa: F401
from schedules import softmax  # noqa: F401
from schedules import arm, cuda  # noqa: F401
