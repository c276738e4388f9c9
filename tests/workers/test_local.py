"""Local measurement in a sandbox child: a crashing or hanging kernel is recorded with the right
invalidity and the measurer keeps working (real TVM builds, real child processes)."""

from __future__ import annotations


import numpy as np
import pytest

from tuner import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.workloads import parse_spec
from workers.local import LocalMeasurer
from workers.sandbox import _check

from tests.kernels import CRASH, HANG

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def _inp(spec: dict, trial: str, *, verify: bool = True, trace_json: str | None = None,
         run_timeout_s: float = 20.0, build_timeout_s: float = 60.0) -> MeasureInput:
    wl = parse_spec(spec)
    if trace_json is None:
        trace_json = tv.trace_to_json(tv.Schedule(wl.mod()).trace)
    opts = MeasureOptions(min_repeat_ms=5, repeats=3, num_threads=1, verify=verify,
                          run_timeout_s=run_timeout_s, build_timeout_s=build_timeout_s)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec,
                        target=TARGET, trace_json=trace_json, options=opts)


def _tiled_matmul_trace(spec: dict) -> str:
    sch = tv.Schedule(parse_spec(spec).mod())
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    i, j, k = sch.get_loops(blk)
    _, ji = sch.split(j, [None, 16])
    sch.vectorize(ji)
    return tv.trace_to_json(sch.trace)


MATMUL = {"op": "matmul", "shape": [64, 64, 64]}


def test_good_kernel_is_verified_and_timed() -> None:
    with LocalMeasurer() as m:
        res = m.measure_one(_inp(MATMUL, "t-ok", trace_json=_tiled_matmul_trace(MATMUL)))
    assert res.invalidity is Invalidity.OK, res.error_msg
    assert len(res.latencies_s) == 3 and all(x > 0 for x in res.latencies_s)
    assert res.median_s is not None and res.cv is not None
    assert res.max_abs_err is not None and res.max_abs_err < 1e-3
    assert res.worker and res.build_s and res.build_s > 0


def test_crashing_kernel_is_a_run_error_and_the_measurer_survives() -> None:
    crash = {"op": "tir", "tvmscript": CRASH}
    with LocalMeasurer() as m:
        res = m.measure_one(_inp(crash, "t-crash", verify=False))
        assert res.invalidity is Invalidity.RUN_ERROR
        assert "SIGSEGV" in (res.error_msg or "")
        assert m.restarts == 1
        after = m.measure_one(_inp(MATMUL, "t-after-crash"))
    assert after.invalidity is Invalidity.OK, after.error_msg


def test_hanging_kernel_is_a_run_timeout_and_the_measurer_survives() -> None:
    hang = {"op": "tir", "tvmscript": HANG}
    with LocalMeasurer() as m:
        res = m.measure_one(_inp(hang, "t-hang", verify=False, run_timeout_s=3))
        assert res.invalidity is Invalidity.RUN_TIMEOUT
        assert "3 s" in (res.error_msg or "")
        after = m.measure_one(_inp(MATMUL, "t-after-hang"))
    assert after.invalidity is Invalidity.OK, after.error_msg


def test_slow_build_is_a_build_timeout() -> None:
    # fully unrolling 64x64 loop bodies takes LLVM about a second; allow it a tenth of that
    sch = tv.Schedule(parse_spec(MATMUL).mod())
    _, j, k = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    sch.unroll(j)
    sch.unroll(k)
    with LocalMeasurer() as m:
        res = m.measure_one(_inp(MATMUL, "t-build", trace_json=tv.trace_to_json(sch.trace),
                                 build_timeout_s=0.1))
        assert res.invalidity is Invalidity.BUILD_TIMEOUT
        after = m.measure_one(_inp(MATMUL, "t-after-build"))
    assert after.invalidity is Invalidity.OK, after.error_msg


def test_a_trace_that_does_not_apply_is_a_build_error() -> None:
    other = _tiled_matmul_trace(MATMUL)
    with LocalMeasurer() as m:
        res = m.measure_one(_inp({"op": "softmax", "shape": [4, 8]}, "t-bad", trace_json=other))
    assert res.invalidity is Invalidity.BUILD_ERROR
    assert res.error_msg


@pytest.mark.parametrize(
    ("got", "ok"),
    [(np.array([1.0, 2.0]), True), (np.array([1.0, 2.1]), False),
     (np.array([1.0, np.nan]), False), (np.array([1.0, 2.0, 3.0]), False)],
)
def test_check_compares_against_the_reference(got: np.ndarray, ok: bool) -> None:
    passed, _, why = _check([got], [np.array([1.0, 2.0])], rtol=1e-3, atol=1e-3)
    assert passed is ok
    assert (why is None) is ok


def test_packed_programs_are_verified_when_they_could_be_best() -> None:
    """A kernel with pre-packed weights needs a second build to verify: done for every candidate
    that beats the best so far (verify_below_s), skipped for the others."""
    from dataclasses import replace

    from schedules.registry import TEMPLATES, _load

    _load()
    spec = {"op": "dense", "shape": [16, 32, 24]}
    wl = parse_spec(spec)
    sch = TEMPLATES["gemm-x86"].apply(tv.Schedule(wl.mod(), seed=3), wl, tv.make_target(TARGET))[0]
    base = _inp(spec, "t-packed", trace_json=tv.trace_to_json(sch.trace))
    with LocalMeasurer() as m:
        first = m.measure_one(base)  # no best yet: verified
        slower = m.measure_one(replace(base, trial_id="t-slower",
                                       options=replace(base.options, verify_below_s=1e-12)))
        faster = m.measure_one(replace(base, trial_id="t-faster",
                                       options=replace(base.options, verify_below_s=10.0)))
    assert first.ok and first.max_abs_err is not None
    assert slower.ok and slower.max_abs_err is None
    assert faster.ok and faster.max_abs_err is not None
