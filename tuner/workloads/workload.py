"""`Workload`: a validated, keyed workload that can build its PrimFunc, inputs and reference."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ml_dtypes  # noqa: F401  (gives numpy the "bfloat16" dtype)
import numpy as np

from ..core.errors import SpecError
from .base import ArgSpec, canonical_json
from .ops import OPS

if TYPE_CHECKING:
    from ..core.tvm_api import IRModule, PrimFunc


@dataclass(frozen=True)
class Workload:
    """Build with `parse_spec` / `from_cli`, not directly.

    key: canonical, identical in every process (`<op>-<sha256(canonical spec)[:16]>`, or
    `tir-<structural hash>`); spec: canonical JSON-able spec with every default filled in
    (`parse_spec(w.spec) == w`); flops: FLOP count (integer ops for int8).
    """

    key: str
    op: str
    spec: dict[str, Any]
    flops: int
    description: str
    num_outputs: int
    _arg_specs: tuple[ArgSpec, ...] = field(default=(), compare=False, repr=False)
    _tolerance: tuple[float, float] = field(default=(0.0, 0.0), compare=False, repr=False)
    _divisors: tuple[int, ...] = field(default=(), compare=False, repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __hash__(self) -> int:
        return hash(self.key)

    def __getstate__(self) -> dict[str, Any]:  # pickling drops the TVM objects
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def num_inputs(self) -> int:
        return len(self._arg_specs) - self.num_outputs

    def spec_json(self) -> str:
        return canonical_json(self.spec)

    # --- TVM side ------------------------------------------------------------------------------

    def prim_func(self) -> PrimFunc:
        """The (cached) PrimFunc: params are inputs then outputs; global_symbol "main"."""
        if "func" not in self._cache:
            self._cache["func"] = OPS[self.op].prim_func(self.spec)
        return self._cache["func"]

    def mod(self) -> IRModule:
        if "mod" not in self._cache:
            from ..core.tvm_api import tvm

            self._cache["mod"] = tvm.IRModule({"main": self.prim_func()})
        return self._cache["mod"]

    def shash(self) -> str:
        """16 hex digits: the identity hash of `mod()` (`identity.identity_hash`: the structural
        hash of its normal form, the same for relax's int64 spelling of the computation)."""
        if "shash" not in self._cache:
            from .identity import identity_hash

            self._cache["shash"] = identity_hash(self.mod())
        return self._cache["shash"]

    # --- data ----------------------------------------------------------------------------------

    def arg_specs(self) -> list[ArgSpec]:
        """[(name, shape, dtype)] for every param: inputs then outputs."""
        return list(self._arg_specs)

    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Deterministic inputs: floats (bfloat16: an ml_dtypes array) uniform in [-1, 1] (a `tir`
        input read as a divisor: in ±[0.5, 1], the same draw moved away from 0), uint* in
        [0, 256), int* in [-128, 128), bool in {False, True}."""
        rng = np.random.default_rng(seed)
        out = []
        for i, (_, shape, dt) in enumerate(self._arg_specs[: self.num_inputs]):
            if dt.startswith("float") or dt == "bfloat16":
                u = rng.uniform(-1.0, 1.0, size=shape)
                a = (np.copysign(0.5 + 0.5 * np.abs(u), u) if i in self._divisors else u).astype(dt)
            elif dt == "bool":
                a = rng.integers(0, 2, size=shape).astype(bool)
            elif dt.startswith("uint"):
                a = rng.integers(0, 256, size=shape, dtype=np.int64).astype(dt)
            else:
                a = rng.integers(-128, 128, size=shape, dtype=np.int64).astype(dt)
            out.append(a)
        return out

    def reference(self, inputs: list[np.ndarray], fill: str = "zeros") -> list[np.ndarray]:
        """The expected outputs for `inputs`: numpy (independent of TVM) for the built-in ops;
        for `tir` the unscheduled function built and run with TVM on this CPU, its outputs
        filled first as `tuner.workloads.tir.output_fill(fill)` says (a kernel that reads an
        output before writing it depends on that)."""
        ins = self._arg_specs[: self.num_inputs]
        if len(inputs) != len(ins):
            raise SpecError(f"{self.op} takes {len(ins)} inputs, got {len(inputs)}",
                            field="inputs")
        for i, ((name, shape, _dt), x) in enumerate(zip(ins, inputs, strict=True)):
            if tuple(np.shape(x)) != tuple(shape):
                raise SpecError(f"input {name} must have shape {list(shape)}, got "
                                f"{list(np.shape(x))}", field=f"inputs[{i}]")
        if self.op == "tir":
            from .tir import run_reference

            arrays = [np.asarray(x, dtype=dt) for (_, _, dt), x in zip(ins, inputs, strict=True)]
            return run_reference(self.mod(), list(self._arg_specs), arrays, fill)
        ref = OPS[self.op].reference
        assert ref is not None
        return ref(self.spec, list(inputs))

    def tolerance(self) -> tuple[float, float]:
        """(rtol, atol) for np.allclose(actual, reference): exact for integer outputs."""
        return self._tolerance

    def output_elements(self) -> int:
        return sum(math.prod(s) for _, s, _ in self._arg_specs[self.num_inputs:])
