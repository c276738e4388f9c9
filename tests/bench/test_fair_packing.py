"""The fused suite's packing rule (bench/fused.py, bench/kernels.py): a task's bound constants are
layout-free (so MetaSchedule may pack them at compile time, as tunefarm's templates do), and a
packing that reads a runtime input is timed in every call, never paid once outside it."""

from __future__ import annotations

import numpy as np

from bench import fused
from bench.kernels import prepare
from tests.schedules.test_spaces import sample_points
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

TARGET = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}  # AVX2: runs on every CI CPU


def _workload(func: object) -> object:
    return parse_spec({"op": "tir", "tvmscript": func.script()})  # type: ignore[attr-defined]


def _gemm_kernel(w: object) -> object:
    from schedules import registry

    target = tv.make_target(TARGET)
    (sch, *_) = sample_points(registry.space_generator("gemm-x86", w, target), w, target, n=1)
    inputs = w.make_inputs(0)  # type: ignore[attr-defined]
    kernel = prepare(sch.mod, w, inputs, target)
    kernel()
    ref = w.reference(inputs)  # type: ignore[attr-defined]
    np.testing.assert_allclose(kernel.outputs()[0], ref[0], rtol=1e-4, atol=1e-4)
    return kernel


def test_a_bound_weight_is_layout_free_and_packed_once() -> None:
    func = fused.linear(32, 48, 64)
    free = [int(i) for i in func.attrs["layout_free_buffers"]]
    names = [p.name for p in func.params]
    assert [names[i] for i in free] == ["param_0", "param_1"]  # the weight and the bias
    kernel = _gemm_kernel(_workload(func))
    assert kernel.packing_timed == [] and [p["from"] for p in kernel.packed] == [["param_0"]]


def test_a_runtime_operand_is_packed_inside_the_timed_call() -> None:
    func = fused.matmul((32, 64), (64, 48))  # both operands are inputs: nothing layout-free
    assert list(func.attrs.get("layout_free_buffers", [])) == []
    kernel = _gemm_kernel(_workload(func))
    assert kernel.packed == [] and kernel.packing_timed == ["b"]
    # the timed function is the whole program: it takes b as given, not packed
    assert [tuple(a.shape) for a in kernel.args] == [(32, 64), (64, 48), (32, 48)]
