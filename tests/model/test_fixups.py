"""The relax rewrites of the model pipeline (`tuner.model.fixups`) that change arithmetic:
`SmallPower` computes `power(x, 2|3|4)` as products, so no PrimFunc of a model calls libm's
`powf` per element for GPT-2's GELU or an RMS norm's square. Real relax and TVM builds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tuner.core.tvm_api import relax, tvm
from tuner.model.fixups import SmallPower
from tuner.model.pipeline import partition

TARGET = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}
SHAPE = (4, 64)


def _module(exponent: float) -> Any:
    """GPT-2's GELU, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·pow(x, exponent))))`, as
    `transformers` writes it and relax's frontend imports it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))

    def c(v: float) -> Any:
        return relax.const(v, "float32")

    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.power(x, c(exponent)))
            inner = bb.emit(relax.op.add(x, bb.emit(relax.op.multiply(p, c(0.044715)))))
            t = bb.emit(relax.op.tanh(bb.emit(relax.op.multiply(inner,
                                                                c(math.sqrt(2 / math.pi))))))
            half = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, c(0.5))),
                                             bb.emit(relax.op.add(t, c(1.0)))))
            out = bb.emit_output(half)
        bb.emit_func_output(out)
    return bb.get()


def _gelu(x: np.ndarray, exponent: float) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** exponent)))


def _calls(mod: Any, name: str) -> int:
    found: list[Any] = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call)
        and getattr(e.op, "name", "") == name else None)
    return len(found)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 4.0])
def test_a_small_power_becomes_products_with_the_same_result(exponent: float) -> None:
    mod = _module(exponent)
    rewritten = SmallPower()(mod)
    assert _calls(mod, "relax.power") == 1 and _calls(rewritten, "relax.power") == 0
    x = np.random.default_rng(0).standard_normal(SHAPE).astype("float32")
    target = tvm.target.Target(TARGET)
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _gelu(x.astype("float64"), exponent), rtol=1e-5, atol=1e-6)


def test_another_power_is_left_to_libm() -> None:
    mod = _module(2.5)
    assert _calls(SmallPower()(mod), "relax.power") == 1


def test_the_partitioned_gelu_calls_no_powf() -> None:
    """The task a model's GELU becomes: before the rewrite its PrimFunc called `T.pow` per
    element (scalar `powf`, 27% of GPT-2's layer); now it multiplies."""
    funcs = [f for f in partition(_module(3.0), TARGET).functions.values()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and not any("T.pow(" in f.script() for f in funcs)
