"""Parallel builds ahead of measurement: failures are results, the sandbox only loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.local import LocalMeasurer
from tuner.workloads import parse_spec

TARGET = RUN_X86
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


def test_a_path_a_build_process_answers_must_be_its_own_file(tmp_path: Path) -> None:
    """A build process runs untrusted code: the path it answers is used (hashed, loaded,
    removed) only if it is a regular file inside the builder's directory."""
    from tuner.measure.builder import Prebuilder

    b = Prebuilder(workers=0)
    try:
        inside = Path(b._dir) / "k.so"
        inside.write_bytes(b"\0")
        assert b.own_file(str(inside)) == str(inside)
        outside = tmp_path / "secret"
        outside.write_text("x")
        link = Path(b._dir) / "link.so"
        link.symlink_to(outside)
        for bad in (str(outside), str(link), str(Path(b._dir) / ".." / "x"), b._dir, None, 3):
            with pytest.raises(ValueError, match="outside its build directory"):
                b.own_file(bad)
    finally:
        b.close()
