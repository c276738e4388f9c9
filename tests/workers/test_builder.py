"""Parallel builds ahead of measurement: failures are results, the sandbox only loads."""

from __future__ import annotations

from tuner import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.workloads import parse_spec
from workers.local import LocalMeasurer

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
OPTS = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=2)


def _inp(spec: dict, trial: str, trace_json: str) -> MeasureInput:
    wl = parse_spec(spec)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec, target=TARGET,
                        trace_json=trace_json, options=OPTS)


def _vectorized(spec: dict) -> str:
    """A small real schedule: the first block's outer loop runs in parallel."""
    sch = tv.Schedule(parse_spec(spec).mod())
    first, *_ = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    sch.parallel(first)
    return tv.trace_to_json(sch.trace)


def test_a_prepared_batch_is_built_in_parallel_then_verified_and_timed() -> None:
    mm = {"op": "matmul", "shape": [64, 64, 64]}
    soft = {"op": "softmax", "shape": [4, 32]}
    good = [_inp(mm, "b-mm", _vectorized(mm)), _inp(soft, "b-soft", _vectorized(soft))]
    bad = _inp(soft, "b-bad", _vectorized(mm))  # a matmul trace does not apply to softmax
    with LocalMeasurer(build_workers=2) as m:
        m.prepare([*good, bad])
        results = [m.measure_one(i) for i in [*good, bad]]
        assert m.restarts == 0
    ok_mm, ok_soft, failed = results
    for r in (ok_mm, ok_soft):
        assert r.invalidity is Invalidity.OK, r.error_msg
        assert r.build_s and r.build_s > 0 and r.max_abs_err is not None and len(r.latencies_s) == 3
    assert failed.invalidity is Invalidity.BUILD_ERROR and failed.error_msg


def test_without_prepare_the_sandbox_builds_itself() -> None:
    mm = {"op": "matmul", "shape": [32, 32, 32]}
    with LocalMeasurer(build_workers=2) as m:
        res = m.measure_one(_inp(mm, "b-direct", _vectorized(mm)))
    assert res.invalidity is Invalidity.OK, res.error_msg
