"""/v1/spaces: the search spaces (templates with their knobs, and "auto") as JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from schedules import registry
from tuner.core.errors import NotFound
from tuner.workloads import OPS

from ..deps import ReaderDep
from ..schemas import Problem
from . import V1

router = APIRouter(prefix=f"{V1}/spaces", tags=["spaces"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {401: {"model": Problem}, 403: {"model": Problem}}


@router.get("", responses=_PROBLEMS)
def list_spaces(_: ReaderDep) -> list[dict[str, Any]]:
    """Every space (templates, then auto)."""
    return [registry.describe(n) for n in registry.space_names() if n != "default"]


@router.get("/{op}", responses={**_PROBLEMS, 404: {"model": Problem}})
def op_spaces(op: str, _: ReaderDep) -> list[dict[str, Any]]:
    """The spaces that can serve `op` (templates first, then auto)."""
    if op not in OPS:
        raise NotFound(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
    return registry.describe_op(op)
