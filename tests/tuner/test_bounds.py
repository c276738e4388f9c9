"""Untrusted kernels provably in bounds (`tuner.workloads.bounds`). Indexing by data (`take`,
embedding lookups): a gather's index read from a buffer is clamped into the buffer before the
function is keyed, checked, tuned or run, so an out-of-range index never reads or writes outside
a buffer, and the in-range results are numpy's. Every other access must be proven inside its
buffer by the analyser, or the function is refused; so are buffer views that are not compact.
(Loop bounds read from a buffer stay refused: `test_tvmscript_isolation.py`.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import guarded
from tuner.core import tvm_api as tv
from tuner.core.errors import SpecError
from tuner.workloads import parse_spec
from tuner.workloads.bounds import clamp_data_dependent

# out[i, j] = table[idx[i], j]: relax's legalized `take` (fast mode: no bound of its own)
TAKE = '''@T.prim_func(s_tir=True)
def take(table: T.Buffer((16, 4), "float32"), idx: T.Buffer((8,), "int64"),
         out: T.Buffer((8, 4), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, j in T.grid(8, 4):
        with T.sblock("take"):
            vi, vj = T.axis.remap("SS", [i, j])
            T.reads(table[idx[vi], vj], idx[vi])
            T.writes(out[vi, vj])
            out[vi, vj] = table[idx[vi], vj]
'''

# a store through a data-dependent index (a scatter) is kept inside its buffer the same way
SCATTER = '''@T.prim_func
def scatter(val: T.Buffer((8,), "float32"), idx: T.Buffer((8,), "int32"),
            out: T.Buffer((16,), "float32")):
    for i in range(8):
        out[idx[i]] = val[i]
'''


def _run(func: object, inputs: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    """`func` built unscheduled and run with its first input and its output in guarded
    buffers: a read past the table's end reads NaN, a write past the output's end is caught."""
    dev = tv.tvm.cpu()
    ex = tv.tvm.compile(tv.tvm.IRModule({"main": func}), target={"kind": "llvm"})
    table = guarded.Guarded(inputs[0].shape, str(inputs[0].dtype), dev)
    table.tensor.copyfrom(inputs[0])
    (out,) = guarded.outputs([(out_shape, "float32")], dev)
    ex["main"](table.tensor, *[tv.tvm.runtime.tensor(x, dev) for x in inputs[1:]], out.tensor)
    return out.numpy()


def test_an_out_of_range_take_stays_inside_its_buffers() -> None:
    w = parse_spec({"op": "tir", "tvmscript": TAKE})
    table = np.arange(64, dtype="float32").reshape(16, 4)
    idx = np.array([3, 0, 15, 16, 100, -1, -(2**40), 7], dtype="int64")
    got = _run(w.prim_func(), [table, idx], (8, 4))
    assert not np.isnan(got).any()  # no read past the table
    assert np.array_equal(got, np.take(table, idx, axis=0, mode="clip"))
    ok = (idx >= 0) & (idx < 16)
    assert np.array_equal(got[ok], table[idx[ok]])  # in range: numpy's own take
    # the reference the measurers check against computes the same
    (ref,) = w.reference([table, idx])
    assert np.array_equal(ref, got)


def test_an_out_of_range_scatter_stays_inside_its_buffer() -> None:
    w = parse_spec({"op": "tir", "tvmscript": SCATTER})
    val = np.arange(1, 9, dtype="float32")
    idx = np.array([0, 20, -3, 5, 15, 16, 2**30, 1], dtype="int32")
    got = _run(w.prim_func(), [val, idx], (16,))  # the guard zone after `out` is intact
    want = np.zeros(16, "float32")
    for v, i in zip(val, np.clip(idx, 0, 15), strict=True):
        want[i] = v
    assert np.array_equal(got, want)


def test_the_clamp_is_idempotent_and_keyed() -> None:
    w = parse_spec({"op": "tir", "tvmscript": TAKE})
    printed = w.prim_func().script()
    assert "T.max(T.min(idx[vi], T.int64(15)), T.int64(0))" in printed
    again = parse_spec({"op": "tir", "tvmscript": printed})
    assert again.key == w.key  # the clamped form is its own normal form
    func = w.prim_func()
    assert clamp_data_dependent(func).same_as(func)


def test_an_index_in_range_by_construction_is_left_alone() -> None:
    """`idx[i] % 16` (floormod of a non-negative extent) is proven in range: no clamp."""
    text = TAKE.replace("table[idx[vi], vj]", "table[T.floormod(idx[vi], 16), vj]")
    func = parse_spec({"op": "tir", "tvmscript": text}).prim_func()
    assert "T.max(T.min" not in func.script()


# every access of an untrusted function is proven inside its buffer, or the function is refused
# (each of these compiled and ran past a 16-element buffer before)
UNPROVEN = '''@T.prim_func
def f(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        B[{index}] = A[i]
'''


@pytest.mark.parametrize("index", [
    "T.bitwise_xor(i, 1024)", "T.shift_left(i, 10)", "T.bitwise_not(i)", "T.clz(i)",
    "T.q_multiply_shift(i, 1073741824, 31, 10)", "T.bitwise_or(i, 64)",
    'T.Cast("int32", T.Cast("float32", i) * T.float32(1.5))',  # a float-to-int cast
    "i * 1073741824 * 4 + i",  # wraps around in int32
])
def test_an_index_the_analyser_cannot_bound_is_refused(index: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"op": "tir", "tvmscript": UNPROVEN.format(index=index)})
    msg = str(info.value)
    assert info.value.field == "tvmscript" and "not proven inside its buffer: B[" in msg, msg


@pytest.mark.parametrize("body,fragment", [
    ('    X = T.alloc_buffer((16,), "float32", strides=[64])\n    for i in range(16):\n'
     "        X[i] = A[i]\n        B[i] = X[i]\n", "alloc_buffer X has strides"),
    ("    for i in range(1):\n        with T.sblock(\"v\"):\n"
     '            V = T.match_buffer(B[0:16], (16,), "float32", elem_offset=1024)\n'
     "            for j in range(16):\n                V[j] = A[j]\n",
     "match_buffer V has strides [] or an element offset"),
])
def test_a_buffer_view_that_is_not_compact_is_refused(body: str, fragment: str) -> None:
    text = UNPROVEN.split("    for i")[0].replace("@T.prim_func", "@T.prim_func(s_tir=True)") + body
    with pytest.raises(SpecError) as info:
        parse_spec({"op": "tir", "tvmscript": text})
    assert fragment in str(info.value), str(info.value)


def test_a_guarded_access_is_proven_by_its_guard() -> None:
    """Padding as relax and topi write it: `if_then_else(1 <= i, A[i - 1], 0)` and an `if`."""
    text = UNPROVEN.replace("        B[{index}] = A[i]",
                            "        B[i] = T.if_then_else(1 <= i, A[i - 1], T.float32(0))\n"
                            "        if i < 8:\n            B[i + 8] = A[i]")
    assert parse_spec({"op": "tir", "tvmscript": text}).key
    unguarded = UNPROVEN.replace("        B[{index}] = A[i]",
                                 "        B[i] = T.Select(1 <= i, A[i - 1], T.float32(0))")
    with pytest.raises(SpecError, match=r"out-of-bounds check failed: .*buffer A"):
        parse_spec({"op": "tir", "tvmscript": unguarded})  # Select evaluates both sides



CONCAT = '''@T.prim_func(s_tir=True)
def f(A: T.Buffer((2, 8), "float32"), B: T.Buffer((2, 1), "float32"),
      C: T.Buffer((2, 9), "float32")):
    for i, j in T.grid(2, 9):
        with T.sblock("T_concat"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = T.if_then_else({split} <= vj, B[vi, vj - {split}], A[vi, vj])
'''


def test_a_concatenation_is_proven_by_its_guard_on_both_sides() -> None:
    """A concatenation as relax legalizes it (a KV cache's `torch.cat`): the second input read
    where the guard holds, the first where it does not, which bounds i below 8. A guard one
    element off leaves the first input's read unproven."""
    assert parse_spec({"op": "tir", "tvmscript": CONCAT.format(split=8)}).key
    int64 = CONCAT.format(split="T.int64(8)").replace("T.grid(2, 9)",
                                                      "T.grid(T.int64(2), T.int64(9))")
    assert parse_spec({"op": "tir", "tvmscript": int64}).key
    with pytest.raises(SpecError, match=r"out-of-bounds check failed: .*buffer A"):
        parse_spec({"op": "tir", "tvmscript": CONCAT.format(split=9)})
