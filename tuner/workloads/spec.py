"""`parse_spec` (validate + normalize a spec dict into a Workload) and `from_cli`."""

from __future__ import annotations

import math
import re
from typing import Any

from ..core.config import get_settings
from ..core.errors import SpecError
from .base import OpDef, positive_int, spec_key
from .ops import OPS
from .tir import parse_tir
from .workload import Workload

PAIR_PARAMS = frozenset({"stride", "padding", "dilation"})
INT_PARAMS = frozenset({"num_outputs"})


def _known_ops() -> str:
    return ", ".join(OPS)


def parse_spec(spec: dict[str, Any]) -> Workload:
    """Validate and normalize a workload spec. Raises SpecError naming the offending field."""
    if not isinstance(spec, dict):
        raise SpecError(f"a workload spec must be a JSON object, got {type(spec).__name__}",
                        field="spec")
    op = spec.get("op")
    if op is None:
        raise SpecError(f"missing; known ops: {_known_ops()}", field="op")
    if not isinstance(op, str) or op not in OPS:
        raise SpecError(f"unknown op {op!r}; known ops: {_known_ops()}", field="op")
    if op == "tir":
        t = parse_tir(spec)
        w = Workload(key=t.key, op="tir", spec=t.spec, flops=t.flops, description=t.description,
                     num_outputs=t.spec["num_outputs"], _arg_specs=tuple(t.args),
                     _tolerance=t.tolerance, _divisors=t.divisors)
        w._cache["func"] = t.func
        return w
    opdef = OPS[op]
    unknown = sorted(str(k) for k in spec if k not in opdef.fields)
    if unknown:
        raise SpecError(f"unknown field(s) {', '.join(unknown)} for op {op}; its fields are: "
                        f"{', '.join(opdef.fields)}", field=unknown[0])
    # a missing field or null (JSON) takes the default
    dtype = spec.get("dtype")
    canon: dict[str, Any] = {
        "op": op, "shape": _shape(opdef, spec.get("shape")),
        "dtype": _dtype(opdef, opdef.default_dtype if dtype is None else dtype)}
    for p in opdef.params:
        value = spec.get(p.name)
        canon[p.name] = p.normalize(p.default if value is None else value)
    opdef.check(canon)
    assert opdef.args is not None and opdef.flops is not None and opdef.tolerance is not None
    args = opdef.args(canon)
    limits = get_settings()
    for name, shape, _ in args:
        n = math.prod(shape)
        if n > limits.max_tensor_elements:
            raise SpecError(f"tensor {name} {list(shape)} has {n} elements; the limit "
                            f"(max_tensor_elements) is {limits.max_tensor_elements}",
                            field="shape")
    flops = int(opdef.flops(canon))
    if flops > limits.max_ops:
        raise SpecError(f"{op} of this shape needs {flops:.3g} operations; the limit (max_ops) "
                        f"is {limits.max_ops:.3g}", field="shape")
    return Workload(key=spec_key(op, canon), op=op, spec=canon, flops=flops,
                    description=opdef.description(canon), num_outputs=opdef.num_outputs,
                    _arg_specs=tuple(args), _tolerance=opdef.tolerance(canon))


def _shape(opdef: OpDef, shape: object) -> list[int]:
    n = len(opdef.shape_names)
    meaning = f"{opdef.name} takes a shape of {n} positive integers: {opdef.shape_doc}"
    if shape is None:
        raise SpecError(f"missing; {meaning}", field="shape")
    if not isinstance(shape, list | tuple):
        raise SpecError(f"must be a list; {meaning}; got {shape!r}", field="shape")
    if len(shape) != n:
        raise SpecError(f"has {len(shape)} dims; {meaning}", field="shape")
    return [positive_int(v, f"shape[{i}]", f"{opdef.shape_names[i]} (shape[{i}] of {opdef.name})")
            for i, v in enumerate(shape)]


def _dtype(opdef: OpDef, dtype: object) -> str:
    if not isinstance(dtype, str) or dtype not in opdef.dtypes:
        if len(opdef.dtypes) == 1:
            raise SpecError(f"{opdef.name} has the fixed dtype {opdef.dtypes[0]!r} "
                            f"({opdef.shape_doc}); got {dtype!r}", field="dtype")
        raise SpecError(f"unknown dtype {dtype!r} for {opdef.name}; allowed: "
                        f"{', '.join(opdef.dtypes)}", field="dtype")
    return dtype


# ---------------------------------------------------------------------------------------------
# CLI

_SEP = re.compile(r"\s*[,xX*]\s*|\s+")


def _ints(text: str, field: str) -> list[int]:
    body = text.strip().strip("[]()").strip()
    if not body:
        raise SpecError("is empty; give integers like 512,512,512 or 512x512x512", field=field)
    out = []
    parts = _SEP.split(body)
    for i, part in enumerate(parts):
        sub = f"{field}[{i}]" if len(parts) > 1 or field == "shape" else field
        try:
            out.append(int(part))
        except ValueError:
            raise SpecError(f"{part!r} is not an integer", field=sub) from None
    return out


def from_cli(op: str, shape: str | list[int] | None,
             params: dict[str, str] | None = None) -> Workload:
    """A Workload from CLI arguments: shape "512,512,512" or "512x512x512" (or a list);
    params such as {"stride": "2", "padding": "1,1", "layout": "NHWC", "dtype": "float32"}.
    For op "tir": shape is empty/None and params hold "tvmscript" (text) and "num_outputs"."""
    spec: dict[str, Any] = {"op": op.strip() if isinstance(op, str) else op}
    if isinstance(shape, str):
        if shape.strip():
            spec["shape"] = _ints(shape, "shape")
    elif shape is not None and (op != "tir" or len(shape)):
        spec["shape"] = [int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v
                         for v in shape]
    for k, v in (params or {}).items():
        if isinstance(v, str) and k in PAIR_PARAMS:
            vals = _ints(v, k)
            spec[k] = vals[0] if len(vals) == 1 else vals
        elif isinstance(v, str) and k in INT_PARAMS:
            vals = _ints(v, k)
            if len(vals) != 1:
                raise SpecError(f"must be one integer, got {v!r}", field=k)
            spec[k] = vals[0]
        elif isinstance(v, str) and k != "tvmscript":
            spec[k] = v.strip()
        else:
            spec[k] = v
    return parse_spec(spec)


__all__ = ["from_cli", "parse_spec"]
