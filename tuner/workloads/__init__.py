"""Workloads: validated, canonically keyed tensor programs (built-in ops or vetted TVMScript).

    w = parse_spec({"op": "matmul", "shape": [512, 512, 512]})
    w.key, w.flops, w.description           # "matmul-<16 hex>", 268435456, "matmul M=512 ..."
    w.prim_func(), w.mod(), w.shash()        # TVM side (imports TVM lazily)
    x = w.make_inputs(seed=0); y = w.reference(x); rtol, atol = w.tolerance()

`OPS[name].describe()` documents each op's spec fields for the REST API.
"""

from __future__ import annotations

from .base import ArgSpec, OpDef, ParamDef, canonical_json
from .ops import OPS, describe_ops
from .spec import from_cli, parse_spec
from .tvmscript import parse_tvmscript, prime_parser, vet_tvmscript
from .workload import Workload

__all__ = [
    "OPS",
    "ArgSpec",
    "OpDef",
    "ParamDef",
    "Workload",
    "canonical_json",
    "describe_ops",
    "from_cli",
    "parse_spec",
    "parse_tvmscript",
    "prime_parser",
    "vet_tvmscript",
]
