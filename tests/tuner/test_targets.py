from __future__ import annotations

import json

import pytest

from tests.support.targets import HOST_AVX512
from tuner.core import tvm_api as tv
from tuner.core.errors import TargetError
from tuner.core.targets import check_target


def test_host_is_an_explicit_cpu_with_cores() -> None:
    d = tv.target_to_dict(tv.make_target("host"))
    assert d["kind"] == "llvm"
    assert d["mcpu"] not in ("native", "generic", "")
    assert d["num-cores"] >= 1


def test_host_target_offers_only_what_this_cpu_has() -> None:
    """A VM may report a Zen 4 yet hide its AVX-512 (CPUID): code built for the bare `znver4`
    would die of SIGILL. Every feature the host target enables, this machine has."""
    g = tv.tvm_ffi.get_global_func
    lacks = [str(f) for f, on in g("tvm.codegen.llvm.GetHostCPUFeatures")().items() if not on]
    has = g("target.llvm_cpu_has_feature")
    native = tv.make_target({"kind": "llvm", "mcpu": "native", "mattr": ["+sse2"]})
    for target in (tv.make_target("host"), native):
        assert [f for f in lacks if has(f, target)] == []
    assert "+sse2" in tv.target_to_dict(native)["mattr"]  # the caller's own mattr is kept
    # a cover, not a list of all: no "-" entry can go without enabling something this CPU
    # lacks, no "+" entry without losing something it has
    host = tv.host_target_dict()
    cover = host.get("mattr", [])
    for n in range(len(cover)):
        fewer = tv.make_target({**host, "mattr": cover[:n] + cover[n + 1:]})
        if cover[n].startswith("-"):
            assert [f for f in lacks if has(f, fewer)] != [], cover[n]
        else:
            assert not has(cover[n][1:], fewer), cover[n]


def test_host_target_offers_the_vector_and_tile_features_beyond_the_cpus_model() -> None:
    """A VM may report an older CPU model (a Sapphire Rapids as `rocketlake`) than its CPUID
    features: the host target adds them (AVX512-BF16, AMX), AMX only where Linux grants this
    process the tile state."""
    g = tv.tvm_ffi.get_global_func
    has = g("target.llvm_cpu_has_feature")
    on = [str(f) for f, v in g("tvm.codegen.llvm.GetHostCPUFeatures")().items()
          if v and str(f).startswith(("avx", "amx"))]
    if not tv.amx_granted():
        on = [f for f in on if not f.startswith("amx")]
    host = tv.make_target("host")
    assert [f for f in on if not has(f, host)] == []


def test_host_target_passes_the_services_target_check() -> None:
    """What `host` resolves to is what workers register and jobs carry: the API's allowlist must
    take it. An Emerald Rapids VM without AMX turns off `amx-tile` (a hyphen in the name)."""
    check_target(tv.host_target_dict())
    check_target({"kind": "llvm", "mcpu": "emeraldrapids", "num-cores": 2,
                  "mattr": ["-amx-tile", "-avx512fp16", "+avx512vl"]})
    for bad in ("amx-tile", "-amx,tile", "-", "--x", "+AVX"):
        with pytest.raises(TargetError, match="is not a feature"):
            check_target({"kind": "llvm", "mcpu": "znver4", "mattr": [bad]})


def test_canonical_json_is_order_independent() -> None:
    a = tv.make_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    b = tv.make_target(json.dumps({"num-cores": 2, "mcpu": "znver4", "kind": "llvm"}))
    assert tv.canonical_target_json(a) == tv.canonical_target_json(b)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ('{"kind": "llvm", "mcpu": "znver9"}', "does not know mcpu"),
        ("llvm -mcpu=znver4", "is not a target"),
        ("{not json", "not valid JSON"),
        ('{"kind": "nosuchkind"}', "nosuchkind"),
        ('{"kind": "llvm", "bogus": 1}', "bogus"),
        ("[1, 2]", "is not a target"),
    ],
)
def test_bad_targets_are_refused(spec: str, fragment: str) -> None:
    with pytest.raises(TargetError, match=fragment):
        tv.make_target(spec)


def test_native_means_this_cpu_not_generic() -> None:
    d = tv.target_to_dict(tv.make_target({"kind": "llvm", "mcpu": "native"}))
    assert d["mcpu"] == tv.host_target_dict()["mcpu"]


@pytest.mark.skipif(not HOST_AVX512, reason="this CPU has no AVX-512: no zmm code for it")
def test_avx512_code_for_the_host_target() -> None:
    A = tv.te.placeholder((1024,), "float32", name="A")
    B = tv.te.compute((1024,), lambda i: A[i] * 2.0 + 1.0, name="B")
    sch = tv.Schedule(tv.te.create_prim_func([A, B]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    _, ii = sch.split(i, [None, 16])
    sch.vectorize(ii)
    asm = tv.compile_module(sch.mod, tv.make_target("host")).inspect_source("asm")
    assert "zmm" in asm
