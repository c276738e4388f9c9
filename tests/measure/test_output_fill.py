"""A candidate's outputs start as sentinels (NaN), not zeros, so an element it never writes
fails its check. TVM 0.27's `reverse_compute_at` of a padding block into its producer's loop
drops the padding (found in a MobileNetV2 task: every candidate wrote the 4x4 interior of a 5x5
output, verified "correct" on zeroed outputs because the padding value is 0, and a model built
with it read garbage). A workload that reads an output before writing it keeps zeroed outputs,
as its reference did."""

from __future__ import annotations

import numpy as np

from tests.kernels import HEADER
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.evaluate import Prepared
from tuner.measure.sandbox import measure_one
from tuner.workloads import parse_spec
from tuner.workloads.tir import output_fill

PAD = HEADER + '''\
def main(A: T.Buffer((4, 4), "float32"), P: T.Buffer((5, 5), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    B = T.sblock_alloc_buffer((4, 4))
    for i, j in T.grid(4, 4):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)
    for i, j in T.grid(5, 5):
        with T.sblock("P"):
            vi, vj = T.axis.remap("SS", [i, j])
            P[vi, vj] = T.if_then_else(vi < 4 and vj < 4, B[vi, vj], T.float32(0))
'''

# no T.init: the output's first value is part of the computation
ACCUMULATE = HEADER + '''\
def main(A: T.Buffer((8, 16), "float32"), C: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, k in T.grid(8, 16):
        with T.sblock("C"):
            vi, vk = T.axis.remap("SR", [i, k])
            C[vi] = C[vi] + A[vi, vk]
'''
TARGET = {"kind": "llvm"}


def _measure(text: str, schedule: object = None) -> tuple[object, Prepared]:
    w = parse_spec({"op": "tir", "tvmscript": text})
    sch = tv.Schedule(w.mod())
    if schedule is not None:
        schedule(sch)  # type: ignore[operator]
    prep = Prepared(w.spec)
    inp = MeasureInput(trial_id="fill", workload_key=w.key, workload_spec=w.spec, target=TARGET,
                       trace_json=tv.trace_to_json(sch.trace),
                       options=MeasureOptions(repeats=1, min_repeat_ms=1.0))
    return measure_one(inp, prep, lambda msg: None), prep


def _pad_into_producer(sch: object) -> None:
    p = sch.get_sblock("P")  # type: ignore[attr-defined]
    i, _ = sch.get_loops(sch.get_sblock("B"))  # type: ignore[attr-defined]
    sch.reverse_compute_at(p, i)  # type: ignore[attr-defined]


def test_an_output_element_left_unwritten_is_a_wrong_answer() -> None:
    plain, prep = _measure(PAD)
    assert plain.invalidity == Invalidity.OK, plain.error_msg  # type: ignore[attr-defined]
    assert prep.ensure_fill() == "sentinel"
    res, _ = _measure(PAD, _pad_into_producer)
    assert res.invalidity == Invalidity.WRONG_ANSWER, res  # type: ignore[attr-defined]
    assert "non-finite" in (res.error_msg or "")  # type: ignore[attr-defined]


def test_a_workload_that_reads_its_output_keeps_zeroed_outputs() -> None:
    res, prep = _measure(ACCUMULATE)  # NaN from sentinel outputs, then again from zeros
    assert res.invalidity == Invalidity.OK, res.error_msg  # type: ignore[attr-defined]
    assert prep.fill == "zeros"


def test_sentinels() -> None:
    assert np.isnan(output_fill((2,), "float32", "sentinel")).all()
    assert (output_fill((2,), "int32", "sentinel") == 2**31 - 4).all()
    assert not output_fill((2,), "bool", "sentinel").any()
    assert not output_fill((3,), "float32").any()
