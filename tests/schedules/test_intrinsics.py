"""The activation intrinsics GEMM epilogues tensorize with (erf, tanh, sigmoid over 16 lanes):
their polynomial implementations against the exact functions, over the range that matters and
beyond it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from schedules.intrinsics import ACTIVATION_F32, ACTIVATIONS, use
from tests.support.targets import RUN_X86
from tuner import tvm_api as tv

N = 16 * 1024


def _exact(fn: str, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    if fn == "erf":
        return np.vectorize(math.erf)(x64)
    if fn == "tanh":
        return np.tanh(x64)
    return 1.0 / (1.0 + np.exp(-x64))


def _kernel(fn: str) -> Any:
    x = tv.te.placeholder((N,), "float32", name="x")
    y = tv.te.compute((N,), lambda i: getattr(tv.tvm.tirx, fn)(x[i]), name="y")
    sch = tv.Schedule(tv.te.create_prim_func([x, y]))
    _, lane = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])
    sch.tensorize(lane, use(ACTIVATION_F32.format(fn=fn)))
    return sch, tv.compile_module(sch.mod, tv.make_target(RUN_X86))


@pytest.mark.parametrize("fn", ACTIVATIONS)
def test_activation_intrinsics_match_the_exact_functions(fn: str) -> None:
    sch, rt = _kernel(fn)
    assert f"T.{fn}(" not in sch.mod.script()  # the polynomial replaced the call
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-6, 6, N // 2), rng.normal(0, 3, N // 4),
                        rng.uniform(-1e-3, 1e-3, N // 8), [0.0, -0.0, 1e-30, -1e-30, 20.0,
                                                          -20.0, 90.0, -90.0],
                        np.full(N // 8 - 8, 0.05)]).astype(np.float32)
    dev = tv.tvm.cpu(0)
    out = tv.tvm.runtime.tensor(np.zeros(N, np.float32), dev)
    rt["main"](tv.tvm.runtime.tensor(x, dev), out)
    exact = _exact(fn, x)
    err = np.abs(out.numpy().astype(np.float64) - exact)
    assert err.max() < (4e-7 if fn == "erf" else 5e-7), (fn, float(err.max()),
                                                         float(x[err.argmax()]))
    if fn == "erf":  # the rational form keeps its relative precision everywhere, 0 included
        nonzero = x != 0
        rel = err[nonzero] / np.abs(exact[nonzero])
        assert rel.max() < 4e-7, float(rel.max())
        assert out.numpy()[x == 0].tolist() == [0.0, 0.0]
    # erf and tanh near 0 (about proportional to x there): their relative precision holds
    if fn != "sigmoid":
        small = np.abs(x) < 1e-3
        rel = err[small] / np.maximum(np.abs(_exact(fn, x[small])), 1e-30)
        assert rel.max() < 1e-5, (fn, float(rel.max()))
