"""A kernel timed on packed weights is verified as it was timed: `tuner.measure.packing` splits the
program into its packing functions and the kernel (relax's SplitLayoutRewritePreproc), packs the
workload's weights once per workload, and the sandbox runs the timed kernel on them. The AVX2
int8 template packs W [N, K] into [N/8, K/2, 8, 2]: exact integers, and it runs on every x86."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.schedules.test_int8 import sample, workload
from tests.support.targets import AVX2_X86
from tuner.core import prepack
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions, packing
from tuner.measure.evaluate import Prepared
from tuner.measure.sandbox import measure_one

TEMPLATE = "dense-int8-avx2"


@pytest.fixture(scope="module")
def candidates() -> tuple[Any, list[Any]]:
    w = workload(16, 32, 24)
    return w, sample(w, 3, 7, TEMPLATE, AVX2_X86)


def _packed(weight: np.ndarray) -> np.ndarray:
    n, k = weight.shape  # [N, K] -> [N/8, K/2, 8, 2]
    return weight.reshape(n // 8, 8, k // 2, 2).transpose(0, 2, 1, 3)


def test_kernel_inputs_are_the_weights_packed_once(candidates: tuple[Any, list[Any]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    w, schs = candidates
    prep = Prepared(w.spec)
    target, dev = tv.make_target(AVX2_X86), tv.tvm.cpu(0)
    compiled = []
    real = packing.compile_function
    monkeypatch.setattr(packing, "compile_function",
                        lambda f, t: compiled.append(f) or real(f, t))
    x, weight = prep.inputs
    for sch in schs:  # different tiles, the same packing
        got = prep.packer.kernel_inputs(sch.mod, target, dev)
        assert [a.shape for a in got] == [x.shape, (4, 12, 8, 2)]
        np.testing.assert_array_equal(got[0].numpy(), x)
        np.testing.assert_array_equal(got[1].numpy(), _packed(weight))
        # what the kernel built by the measurers takes
        assert tv.param_specs(tv.strip_layout_rewrite(sch.mod))[:2] == \
            [(tuple(a.shape), str(a.dtype)) for a in got]
    assert len(compiled) == 1


def test_a_program_without_packing_is_its_own_kernel() -> None:
    w = workload(16, 32, 24)
    _, steps, _ = prepack.split(w.mod()["main"], w.arg_specs(), w.num_inputs)
    assert len(steps) == 1
    inputs = Prepared(w.spec).packer.kernel_inputs(w.mod(), tv.make_target(AVX2_X86),
                                                   tv.tvm.cpu(0))
    assert [a.shape for a in inputs] == [(16, 24), (32, 24)]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every module `tv.compile_module` builds from here on, in order."""
    built: list[Any] = []
    real = tv.compile_module
    monkeypatch.setattr(tv, "compile_module", lambda m, t: built.append(m) or real(m, t))
    return built


def _measure(w: Any, sch: Any, prep: Prepared) -> Any:
    opts = MeasureOptions(repeats=1, min_repeat_ms=1.0)  # verify_below_s None: always verified
    inp = MeasureInput(trial_id="packed", workload_key=w.key, workload_spec=w.spec,
                       target=AVX2_X86, trace_json=tv.trace_to_json(sch.trace), options=opts)
    return measure_one(inp, prep, lambda msg: None)


def test_sandbox_verifies_the_timed_kernel_on_packed_weights(
        candidates: tuple[Any, list[Any]], builds: list[Any]) -> None:
    w, schs = candidates
    prep = Prepared(w.spec)
    res = _measure(w, schs[0], prep)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err == 0.0
    # compiled in the sandbox: the kernel to time, the packing function; not the whole program
    assert len(builds) == 2 and prep.packer._packed
    # the check runs the kernel on those packed weights: spoil them and it must fail
    (key,) = prep.packer._packed
    prep.packer._packed[key] = prep.packer._packed[key][::-1].copy()
    res = _measure(w, schs[0], prep)
    assert res.invalidity == Invalidity.WRONG_ANSWER, res.error_msg


def test_sandbox_verifies_the_whole_program_where_the_split_fails(
        candidates: tuple[Any, list[Any]], monkeypatch: pytest.MonkeyPatch,
        builds: list[Any]) -> None:
    w, schs = candidates
    prep = Prepared(w.spec)

    def broken(*_: Any) -> list[Any]:
        raise RuntimeError("no split")

    monkeypatch.setattr(prep.packer, "kernel_inputs", broken)
    res = _measure(w, schs[1], prep)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err == 0.0
    # the kernel to time, then the whole program (packing included) to verify
    assert len(builds) == 2
    assert tv.param_specs(builds[1]) == [(s, d) for _, s, d in w.arg_specs()]


def test_sandbox_times_a_padded_gemm_without_its_packing(builds: list[Any]) -> None:
    """N off the 16 grid: gemm-x86's packing pads the weight (no plain copy, marked for
    `tuner.core.prepack`). The sandbox times the kernel alone, on the weight packed and padded by
    the program's own packing function, and checks it."""
    from schedules import registry
    from tests.schedules.test_spaces import sample_points
    from tuner.workloads import parse_spec

    w = parse_spec({"op": "matmul", "shape": [16, 40, 24]})
    target = tv.make_target(AVX2_X86)
    (sch, *_) = sample_points(registry.space_generator("gemm-x86", w, target), w, target, n=1)
    prep = Prepared(w.spec)
    inp = MeasureInput(trial_id="padded", workload_key=w.key, workload_spec=w.spec,
                       target=AVX2_X86, trace_json=tv.trace_to_json(sch.trace),
                       options=MeasureOptions(repeats=1, min_repeat_ms=1.0))
    res = measure_one(inp, prep, lambda msg: None)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err is not None and res.max_abs_err < 1e-4
    kernel, packing = builds  # the kernel to time, then the padded packing for its check
    assert tv.param_specs(kernel)[1] == ((3, 24, 16), "float32")
    assert "if_then_else" not in kernel.script() and "if_then_else" in packing.script()
