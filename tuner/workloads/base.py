"""Building blocks shared by every op: the `OpDef` registry entry, parameter definitions,
validation helpers (each raises `SpecError` naming the offending field), keys and tolerances.

Nothing here imports TVM; `OpDef.prim_func` imports `tuner.core.tvm_api` lazily so that validating a
spec (the API server, the CLI) stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from ..core.errors import SpecError

if TYPE_CHECKING:
    from ..core.tvm_api import PrimFunc

ArgSpec = tuple[str, tuple[int, ...], str]  # (name, shape, dtype)

FLOAT_DTYPES = ("float32", "float64", "float16")


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def spec_key(op: str, spec: dict[str, Any]) -> str:
    return f"{op}-{hashlib.sha256(canonical_json(spec).encode()).hexdigest()[:16]}"


def num_elements(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(int(d) for d in shape)


# ---------------------------------------------------------------------------------------------
# validation helpers


def is_int(v: object) -> TypeGuard[int | np.integer]:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def positive_int(v: object, field_name: str, what: str) -> int:
    if not is_int(v):
        raise SpecError(f"{what} must be a positive integer, got {v!r}", field=field_name)
    if int(v) <= 0:
        raise SpecError(f"{what} must be a positive integer, got {int(v)}", field=field_name)
    return int(v)


@dataclass(frozen=True)
class ParamDef:
    """An op parameter besides `shape` and `dtype`. kind "pair": an int or [h, w] (normalized
    to [h, w], each >= minimum); kind "choice": one of `choices` (a string)."""

    name: str
    kind: str
    default: str | list[int]
    doc: str
    choices: tuple[str, ...] = ()
    minimum: int = 0

    def normalize(self, value: object) -> str | list[int]:
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise SpecError(f"must be one of {', '.join(self.choices)}; got {value!r}",
                                field=self.name)
            return value
        items = list(value) if isinstance(value, list | tuple) else [value, value]
        if len(items) != 2:
            raise SpecError(f"must be an integer or a pair [h, w]; got {value!r}", field=self.name)
        out = []
        for i, v in enumerate(items):
            sub = f"{self.name}[{i}]" if isinstance(value, list | tuple) else self.name
            if not is_int(v):
                raise SpecError(f"must be an integer (or a pair of integers); got {v!r}", field=sub)
            if int(v) < self.minimum:
                raise SpecError(f"must be >= {self.minimum}; got {int(v)}", field=sub)
            out.append(int(v))
        return out

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "default": self.default, "doc": self.doc}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.kind == "pair":
            d["minimum"] = self.minimum
        return d


STRIDE = ParamDef("stride", "pair", [1, 1], "stride: an int or [h, w]", minimum=1)
PADDING = ParamDef("padding", "pair", [0, 0], "zero padding on each side: an int or [h, w]")
DILATION = ParamDef("dilation", "pair", [1, 1], "kernel dilation: an int or [h, w]", minimum=1)


# ---------------------------------------------------------------------------------------------
# tolerances


def float_tolerance(dtype: str, reduction: int) -> tuple[float, float]:
    """(rtol, atol) for outputs that sum `reduction` products of inputs in [-1, 1].

    The reference is computed in float64, so the only error is the kernel's own rounding. With
    random inputs a reordered sum drifts by about eps * reduction / 4 (random walk over partial
    sums of size ~sqrt(k)/3); atol leaves a margin of ~30x over that, while one dropped or doubled
    term (|a*b| ~ 0.25 on average) still fails.
    """
    r = max(int(reduction), 1)
    if dtype == "float64":
        return 1e-9, 1e-12 * r
    if dtype == "float16":  # fp16 accumulation: ~5e-4 per add
        return 1e-2, 1e-3 * r
    if dtype == "bfloat16":  # a bf16 output (summed in float32): one rounding, 2^-8 relative
        return 1e-2, 1e-4 * r
    return 1e-4, 1e-6 * r


def integer_tolerance() -> tuple[float, float]:
    return 0.0, 0.0


# ---------------------------------------------------------------------------------------------
# the registry entry


def _no_check(spec: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class OpDef:
    """One op of the registry. `spec` arguments of the hooks are canonical (validated) specs."""

    name: str
    shape_doc: str
    shape_names: tuple[str, ...]
    default_dtype: str | None
    dtypes: tuple[str, ...]
    doc: str
    params: tuple[ParamDef, ...] = ()
    inputs_doc: tuple[str, ...] = ()
    outputs_doc: tuple[str, ...] = ()
    num_outputs: int = 1
    # hooks (not part of the JSON description)
    args: Callable[[dict[str, Any]], list[ArgSpec]] | None = field(default=None, repr=False)
    compute: Callable[[dict[str, Any]], list[Any]] | None = field(default=None, repr=False)
    reference: Callable[[dict[str, Any], list[np.ndarray]], list[np.ndarray]] | None = field(
        default=None, repr=False)
    flops: Callable[[dict[str, Any]], int] | None = field(default=None, repr=False)
    tolerance: Callable[[dict[str, Any]], tuple[float, float]] | None = field(default=None,
                                                                              repr=False)
    check: Callable[[dict[str, Any]], None] = field(default=_no_check, repr=False)

    @property
    def fields(self) -> tuple[str, ...]:
        return ("op", "shape", "dtype", *(p.name for p in self.params))

    def describe(self) -> dict[str, Any]:
        """JSON description for the REST API: the spec fields and what they mean."""
        return {
            "op": self.name,
            "doc": self.doc,
            "fields": {
                "shape": {"doc": self.shape_doc, "names": list(self.shape_names),
                          "length": len(self.shape_names)},
                "dtype": {"default": self.default_dtype, "allowed": list(self.dtypes)},
                **{p.name: p.describe() for p in self.params},
            },
            "inputs": list(self.inputs_doc),
            "outputs": list(self.outputs_doc),
            "example": self.example(),
        }

    def example(self) -> dict[str, Any]:
        ex: dict[str, Any] = {"op": self.name, "shape": [16] * len(self.shape_names)}
        if self.default_dtype:
            ex["dtype"] = self.default_dtype
        return ex

    def description(self, spec: dict[str, Any]) -> str:
        parts = [self.name]
        if "layout" in spec:
            parts.append(spec["layout"])
        parts += [f"{n}={v}" for n, v in zip(self.shape_names, spec["shape"], strict=True)]
        for p in self.params:
            if p.kind == "pair":
                parts.append(f"{p.name}={'x'.join(str(v) for v in spec[p.name])}")
        parts.append(spec["dtype"])
        return " ".join(parts)

    def prim_func(self, spec: dict[str, Any]) -> PrimFunc:
        from ..core.tvm_api import te

        assert self.compute is not None
        return cast("PrimFunc",
                    te.create_prim_func(self.compute(spec)).with_attr("global_symbol", "main"))
