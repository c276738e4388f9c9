"""What only the local measurer does (the scenarios every measurer shares are in
test_measurers.py): the build deadline in the sandbox, and the output check."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.local import LocalMeasurer
from tuner.measure.sandbox import _check
from tuner.workloads import parse_spec

TARGET = RUN_X86
MATMUL = {"op": "matmul", "shape": [64, 64, 64]}


def _inp(spec: dict, trial: str, *, trace_json: str | None = None,
         build_timeout_s: float = 60.0) -> MeasureInput:
    wl = parse_spec(spec)
    if trace_json is None:
        trace_json = tv.trace_to_json(tv.Schedule(wl.mod()).trace)
    opts = MeasureOptions(min_repeat_ms=5, repeats=3, num_threads=1, run_timeout_s=20.0,
                          build_timeout_s=build_timeout_s)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec,
                        target=TARGET, trace_json=trace_json, options=opts)


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


@pytest.mark.parametrize(
    ("got", "ok"),
    [(np.array([1.0, 2.0]), True), (np.array([1.0, 2.1]), False),
     (np.array([1.0, np.nan]), False), (np.array([1.0, 2.0, 3.0]), False)],
)
def test_check_compares_against_the_reference(got: np.ndarray, ok: bool) -> None:
    passed, _, why = _check([got], [np.array([1.0, 2.0])], rtol=1e-3, atol=1e-3)
    assert passed is ok
    assert (why is None) is ok
