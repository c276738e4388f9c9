"""tuner.workloads: every op built UNSCHEDULED with TVM and checked against its numpy reference,
flops, canonical keys (also across processes), spec validation and CLI parsing."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.core.config import get_settings
from tuner.core.errors import SpecError
from tuner.core.tvm_api import tvm
from tuner.workloads import OPS, Workload, describe_ops, from_cli, parse_spec

REPO = Path(__file__).resolve().parents[2]

MM_TIR = '''from tvm.script import tirx as T

@T.prim_func(s_tir=True)
def mm(A: T.Buffer((16, 8), "float32"), B: T.Buffer((8, 12), "float32"),
       C: T.Buffer((16, 12), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, j, k in T.grid(16, 12, 8):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
'''

# (spec, expected flops)
CASES = [
    ({"op": "matmul", "shape": [8, 12, 16]}, 2 * 8 * 12 * 16),
    ({"op": "matmul", "shape": [5, 7, 9], "dtype": "float64"}, 2 * 5 * 7 * 9),
    ({"op": "matmul", "shape": [8, 12, 16], "dtype": "float16"}, 2 * 8 * 12 * 16),
    ({"op": "dense", "shape": [8, 12, 16]}, 2 * 8 * 12 * 16),
    ({"op": "batch_matmul", "shape": [2, 8, 12, 16]}, 2 * 2 * 8 * 12 * 16),
    # conv2d: 2*N*O*OH*OW*C*KH*KW
    ({"op": "conv2d", "shape": [1, 4, 9, 9, 6, 3, 3]}, 2 * 6 * 7 * 7 * 4 * 9),
    ({"op": "conv2d", "shape": [1, 4, 9, 9, 6, 3, 3], "layout": "NHWC"}, 2 * 6 * 7 * 7 * 4 * 9),
    ({"op": "conv2d", "shape": [2, 3, 10, 11, 5, 3, 3], "stride": 2, "padding": 1},
     2 * 2 * 5 * 5 * 6 * 3 * 9),
    ({"op": "conv2d", "shape": [2, 3, 10, 11, 5, 3, 3], "stride": 2, "padding": 1,
      "layout": "NHWC"}, 2 * 2 * 5 * 5 * 6 * 3 * 9),
    ({"op": "conv2d", "shape": [1, 3, 11, 10, 4, 3, 3], "dilation": 2, "padding": [2, 1]},
     2 * 4 * 11 * 8 * 3 * 9),
    ({"op": "conv2d", "shape": [1, 3, 10, 11, 5, 3, 2], "stride": [2, 1], "padding": [1, 0],
      "dilation": [1, 2], "layout": "NHWC"}, 2 * 5 * 5 * 9 * 3 * 6),
    ({"op": "depthwise_conv2d", "shape": [1, 4, 9, 9, 3, 3]}, 2 * 4 * 7 * 7 * 9),
    ({"op": "depthwise_conv2d", "shape": [2, 4, 10, 9, 3, 3], "stride": 2, "padding": 1,
      "dilation": [1, 2]}, 2 * 2 * 4 * 5 * 4 * 9),
    ({"op": "softmax", "shape": [4, 33]}, 5 * 4 * 33),
    ({"op": "softmax", "shape": [3, 17], "dtype": "float64"}, 5 * 3 * 17),
    ({"op": "dense_int8", "shape": [8, 12, 16]}, 2 * 8 * 12 * 16),
    ({"op": "tir", "tvmscript": MM_TIR}, 2 * 16 * 12 * 8),
]


def run_unscheduled(w: Workload, inputs: list[np.ndarray]) -> list[np.ndarray]:
    dev = tvm.cpu()
    ex = tvm.compile(w.mod(), target={"kind": "llvm"})
    outs = [tvm.runtime.tensor(np.zeros(shape, dt), dev) for _, shape, dt in
            w.arg_specs()[len(inputs):]]
    ex["main"](*[tvm.runtime.tensor(x, dev) for x in inputs], *outs)
    return [o.numpy() for o in outs]


def _id(case: tuple) -> str:
    spec = case[0]
    extra = "-".join(f"{k}{v}" for k, v in spec.items() if k not in ("op", "shape", "tvmscript"))
    return f"{spec['op']}-{extra}".strip("-")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_builds_runs_and_matches_reference(case: tuple) -> None:
    spec, flops = case
    w = parse_spec(spec)
    assert w.flops == flops
    assert w.num_outputs == 1 and w.op == spec["op"]
    func = w.prim_func()
    assert func is w.prim_func()  # cached
    assert str(func.attrs["global_symbol"]) == "main"
    params = [(str(p.name), tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params]
    assert [(s, d) for _, s, d in params] == [(s, d) for _, s, d in w.arg_specs()]
    inputs = w.make_inputs(seed=3)
    assert len(inputs) == len(w.arg_specs()) - w.num_outputs
    got = run_unscheduled(w, inputs)
    ref = w.reference(inputs)
    rtol, atol = w.tolerance()
    for g, r, (_, shape, dt) in zip(got, ref, w.arg_specs()[len(inputs):], strict=True):
        assert g.shape == r.shape == shape and r.dtype == np.dtype(dt)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    # canonical spec: JSON-able, complete, and parses back to the same workload
    again = parse_spec(json.loads(json.dumps(w.spec)))
    assert again == w and again.key == w.key and again.shash() == w.shash()
    assert len(w.shash()) == 16 and int(w.shash(), 16) >= 0


def test_make_inputs_deterministic_and_ranges() -> None:
    w = parse_spec({"op": "dense_int8", "shape": [64, 8, 64]})
    x1, w1 = w.make_inputs(seed=7)
    x2, w2 = w.make_inputs(seed=7)
    assert np.array_equal(x1, x2) and np.array_equal(w1, w2)
    assert x1.dtype == np.uint8 and w1.dtype == np.int8
    assert x1.min() >= 0 and x1.max() > 200 and w1.min() < -100 and w1.max() > 100
    assert not np.array_equal(x1, w.make_inputs(seed=8)[0])
    a, b = parse_spec({"op": "matmul", "shape": [32, 32, 32]}).make_inputs()
    assert a.dtype == np.float32 and -1 <= a.min() < -0.9 and 0.9 < a.max() <= 1


def test_dense_int8_is_exact() -> None:
    w = parse_spec({"op": "dense_int8", "shape": [4, 6, 300]})
    assert w.tolerance() == (0.0, 0.0)
    inputs = w.make_inputs()
    (got,), (ref,) = run_unscheduled(w, inputs), w.reference(inputs)
    assert ref.dtype == np.int32 and np.array_equal(got, ref)


def test_tolerance_accepts_reordered_sums_and_rejects_wrong_results() -> None:
    w = parse_spec({"op": "matmul", "shape": [16, 16, 2048]})
    a, b = w.make_inputs()
    (ref,) = w.reference([a, b])
    rtol, atol = w.tolerance()
    assert np.allclose(a @ b, ref, rtol=rtol, atol=atol)  # float32 BLAS order
    blocked = sum(a[:, i:i + 64] @ b[i:i + 64] for i in range(0, 2048, 64))
    assert np.allclose(blocked, ref, rtol=rtol, atol=atol)
    dropped = a[:, :-1] @ b[:-1]  # one term of the reduction missing
    assert not np.allclose(dropped, ref, rtol=rtol, atol=atol)
    assert parse_spec({"op": "matmul", "shape": [4, 4, 4], "dtype": "float64"}).tolerance()[0] \
        < rtol < parse_spec({"op": "matmul", "shape": [4, 4, 4], "dtype": "float16"}).tolerance()[0]


def test_defaults_are_filled_and_equivalent_specs_share_a_key() -> None:
    w = parse_spec({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3]})
    assert w.spec == {"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "dtype": "float32",
                      "layout": "NCHW", "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1]}
    same = parse_spec({"op": "conv2d", "shape": (1, 3, 8, 8, 4, 3, 3), "stride": [1, 1],
                       "padding": 0, "dilation": 1, "layout": "NCHW", "dtype": "float32"})
    assert same == w and same.key == w.key and hash(same) == hash(w)
    assert parse_spec({**w.spec, "dtype": None, "stride": None}) == w  # JSON null: the default
    assert parse_spec({**w.spec, "layout": "NHWC"}).key != w.key
    assert parse_spec({**w.spec, "stride": 2}).key != w.key
    assert w.key.startswith("conv2d-") and len(w.key) == len("conv2d-") + 16
    assert w.description == ("conv2d NCHW N=1 C=3 H=8 W=8 O=4 KH=3 KW=3 stride=1x1 padding=0x0 "
                             "dilation=1x1 float32")
    m = parse_spec({"op": "matmul", "shape": [512, 512, 512]})
    assert m.description == "matmul M=512 N=512 K=512 float32"


# Pinned so that a change of the canonicalization (which would orphan every stored record) is
# caught. Recompute only on purpose.
GOLDEN = [
    ({"op": "matmul", "shape": [512, 512, 512]}, "matmul-a799e3d4da708b84"),
    ({"op": "conv2d", "shape": [1, 64, 56, 56, 64, 3, 3], "padding": 1, "layout": "NHWC"},
     "conv2d-feb0e77914702f2a"),
]


@pytest.mark.parametrize("spec,key", GOLDEN)
def test_golden_keys(spec: dict, key: str) -> None:
    assert parse_spec(spec).key == key


def test_golden_structural_hash() -> None:
    # shash() is TVM's structural hash of the normal form (tuner/workloads/identity.py): it
    # depends on the pinned apache-tvm / tvm-ffi versions (tuner.core.tvm_api.REQUIRED). A failure
    # here after an upgrade means every stored workload row needs its shash recomputed.
    assert parse_spec({"op": "matmul", "shape": [512, 512, 512]}).shash() == "5e27380362110623"


def test_keys_and_hashes_stable_across_processes() -> None:
    specs = [{"op": "matmul", "shape": [64, 32, 16]},
             {"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "stride": 2, "layout": "NHWC"},
             {"op": "dense_int8", "shape": [16, 16, 64]},
             {"op": "tir", "tvmscript": MM_TIR}]
    code = ("import json, sys\nfrom tuner.workloads import parse_spec\n"
            "ws = [parse_spec(s) for s in json.loads(sys.stdin.read())]\n"
            "print(json.dumps([[w.key, w.shash()] for w in ws]))\n")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(specs), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [[w.key, w.shash()] for w in map(parse_spec, specs)]
    assert theirs == ours


def test_pickle_round_trip_drops_tvm_objects() -> None:
    w = parse_spec({"op": "dense", "shape": [4, 4, 4]})
    w.prim_func()
    w2 = pickle.loads(pickle.dumps(w))
    assert w2 == w and w2.arg_specs() == w.arg_specs() and w2.tolerance() == w.tolerance()
    assert w2.shash() == w.shash()


def test_registry_describes_every_op() -> None:
    assert set(OPS) == {"matmul", "dense", "batch_matmul", "conv2d", "depthwise_conv2d",
                        "softmax", "dense_int8", "tir"}
    desc = json.loads(json.dumps(describe_ops()))
    assert OPS["matmul"].shape_doc == "M,N,K: A[M,K] x B[K,N] -> C[M,N]"
    assert OPS["matmul"].default_dtype == "float32" and "float16" in OPS["matmul"].dtypes
    assert desc["conv2d"]["fields"]["layout"]["choices"] == ["NCHW", "NHWC"]
    assert desc["conv2d"]["fields"]["stride"]["default"] == [1, 1]
    assert "tvmscript" in desc["tir"]["fields"]
    for name, op in OPS.items():
        assert parse_spec(op.example()).op == name  # every example is a valid spec


BAD_SPECS = [
    (["matmul"], "spec", "JSON object"),
    ({"shape": [1, 2, 3]}, "op", "known ops: matmul, dense"),
    ({"op": "transpose", "shape": [4]}, "op", "unknown op 'transpose'; known ops"),
    ({"op": 3}, "op", "unknown op"),
    ({"op": "matmul"}, "shape", "M,N,K: A[M,K] x B[K,N]"),
    ({"op": "matmul", "shape": [4, 4]}, "shape", "3 positive integers: M,N,K"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3]}, "shape", "N,C,H,W,O,KH,KW"),
    ({"op": "matmul", "shape": "4,4,4"}, "shape", "must be a list"),
    ({"op": "matmul", "shape": [4, 4, 0]}, "shape[2]", "K (shape[2] of matmul) must be a positive"),
    ({"op": "matmul", "shape": [4, -2, 4]}, "shape[1]", "positive integer, got -2"),
    ({"op": "matmul", "shape": [4, 4.5, 4]}, "shape[1]", "got 4.5"),
    ({"op": "matmul", "shape": [4, 4.0, 4]}, "shape[1]", "positive integer"),
    ({"op": "matmul", "shape": [4, True, 4]}, "shape[1]", "positive integer"),
    ({"op": "matmul", "shape": [4, "4", 4]}, "shape[1]", "positive integer"),
    ({"op": "matmul", "shape": [4, 4, 4], "dtype": "float8"}, "dtype", "allowed: float32"),
    ({"op": "matmul", "shape": [4, 4, 4], "dtype": 32}, "dtype", "unknown dtype"),
    ({"op": "softmax", "shape": [4, 4], "dtype": "float16"}, "dtype", "allowed"),
    ({"op": "dense_int8", "shape": [4, 4, 4], "dtype": "float32"}, "dtype", "fixed dtype 'int8'"),
    ({"op": "dense_int8", "shape": [4, 4, 70000]}, "shape[2]", "overflow"),
    ({"op": "matmul", "shape": [4, 4, 4], "stride": 2}, "stride", "unknown field(s) stride"),
    ({"op": "matmul", "shape": [4, 4, 4], "foo": 1, "bar": 2}, "bar", "bar, foo"),
    ({"op": "matmul", "shape": [16384, 16384, 16]}, "shape", "max_tensor_elements"),
    ({"op": "conv2d", "shape": [1, 3, 4, 4, 8, 7, 3]}, "shape[5]", "larger than the padded"),
    ({"op": "conv2d", "shape": [1, 3, 8, 4, 8, 3, 7]}, "shape[6]", "kernel width 7"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 8, 3, 3], "dilation": 4}, "shape[5]", "dilated to 9"),
    ({"op": "conv2d", "shape": [1, 3, 4, 4, 8, 7, 7], "padding": 1}, "shape[5]", "4+2*1=6"),
    ({"op": "depthwise_conv2d", "shape": [1, 3, 4, 4, 5, 5]}, "shape[4]", "larger than"),
    ({"op": "conv2d", "shape": [1, 1, 1, 1, 1, 1, 1], "padding": 5000, "stride": 5000}, "padding",
     "padded input has 100020001 elements"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "layout": "NCWH"}, "layout", "NCHW, NHWC"),
    ({"op": "depthwise_conv2d", "shape": [1, 3, 8, 8, 3, 3], "layout": "NHWC"}, "layout", "NCHW"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "stride": 0}, "stride", ">= 1"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "padding": -1}, "padding", ">= 0"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "stride": [1, 2, 3]}, "stride", "pair"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "stride": [1, "2"]}, "stride[1]", "integer"),
    ({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3], "dilation": 1.5}, "dilation", "integer"),
    ({"op": "tir"}, "tvmscript", "TVMScript"),
    ({"op": "tir", "tvmscript": MM_TIR, "shape": [1]}, "shape", "unknown field"),
    ({"op": "tir", "tvmscript": MM_TIR, "num_outputs": 0}, "num_outputs", "positive"),
    ({"op": "tir", "tvmscript": MM_TIR, "num_outputs": 4}, "num_outputs", "3 parameters"),
]


@pytest.mark.parametrize("spec,field,fragment", BAD_SPECS,
                         ids=[f"{i}-{c[1]}" for i, c in enumerate(BAD_SPECS)])
def test_bad_specs_are_rejected_naming_the_field(spec: dict, field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_op_count_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_settings(), "max_ops", 1e6)
    parse_spec({"op": "matmul", "shape": [64, 64, 64]})  # 524288 ops
    with pytest.raises(SpecError, match="max_ops") as info:
        parse_spec({"op": "matmul", "shape": [128, 64, 64]})
    assert info.value.field == "shape"


# --- from_cli ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["512,512,512", "512x512x512", " 512, 512 , 512 ", "512X512x512",
                                   [512, 512, 512], "[512,512,512]"])
def test_from_cli_shapes(shape: str | list[int]) -> None:
    assert from_cli("matmul", shape) == parse_spec({"op": "matmul", "shape": [512, 512, 512]})


def test_from_cli_params() -> None:
    w = from_cli("conv2d", "1,64,56,56,64,3,3",
                 {"stride": "2", "padding": "1", "layout": "NHWC", "dtype": "float32"})
    assert w.spec["stride"] == [2, 2] and w.spec["padding"] == [1, 1]
    assert w.spec["layout"] == "NHWC" and w.spec["dilation"] == [1, 1]
    w2 = from_cli("conv2d", "1x64x56x56x64x3x3", {"padding": "1x0", "dilation": "2,1"})
    assert w2.spec["padding"] == [1, 0] and w2.spec["dilation"] == [2, 1]
    assert from_cli("dense_int8", "16,16,64").spec["dtype"] == "int8"
    t = from_cli("tir", "", {"tvmscript": MM_TIR, "num_outputs": "1"})
    assert t.key == parse_spec({"op": "tir", "tvmscript": MM_TIR}).key


@pytest.mark.parametrize("op,shape,params,field", [
    ("matmul", "512,abc,512", None, "shape[1]"),
    ("matmul", "512,512", None, "shape"),
    ("matmul", "", None, "shape"),
    ("matmul", "512,512,0", None, "shape[2]"),
    ("conv2d", "1,3,8,8,4,3,3", {"stride": "two"}, "stride"),
    ("conv2d", "1,3,8,8,4,3,3", {"padding": "1,x"}, "padding[1]"),
    ("conv2d", "1,3,8,8,4,3,3", {"groups": "2"}, "groups"),
    ("matmul", "4,4,4", {"dtype": "half"}, "dtype"),
    ("gemm", "4,4,4", None, "op"),
    ("tir", "", {"tvmscript": MM_TIR, "num_outputs": "1,2"}, "num_outputs"),
])
def test_from_cli_errors(op: str, shape: str, params: dict | None, field: str) -> None:
    with pytest.raises(SpecError) as info:
        from_cli(op, shape, params)
    assert info.value.field == field
