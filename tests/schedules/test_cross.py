"""Cross-compiled templates (schedules/arm.py, schedules/cuda.py), checked by compiling only.

There is no ARM machine and no GPU here, so:
- every knob value builds: for each template, a set of traces that together give every sampling
  instruction every decision it can take (replays of the template's trace with other decisions,
  as the search does) plus a few `Template.apply` runs on `Schedule(mod, seed=s)`; each one is
  postprocessed with the template's own postprocessors and compiled;
- the intended instructions are in the output: `fmla v.4s` (NEON fp32), `usdot` (int8: the one
  exact instruction for uint8 x int8, see schedules/arm.py) in the AArch64 assembly; for CUDA,
  `wmma::mma_sync` in the CUDA source and `wmma.mma.sync` in the PTX that nvcc makes of it;
- numerics: the fp32 NEON schedules are compiled for this x86 host and run against numpy (the
  arithmetic is the same, only the instruction selection differs). The int8 schedule is
  tensorized with an AArch64-only LLVM intrinsic, which cannot run here: its traces are run
  without their tensorize step (same packing, tiling and loop order), which checks everything but
  the usdot instruction itself. Where qemu-user and an AArch64 gcc are installed, the real
  AArch64 kernels (usdot included) also run under `qemu-aarch64 -cpu max` against numpy (skipped
  otherwise). The CUDA kernels cannot be run at all (no GPU, and the TVM wheel has no CUDA
  runtime).
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest

from schedules import arm, cuda, registry  # noqa: F401 - importing registers the templates
from schedules.registry import TEMPLATES, spaces_for
from tests.support import guarded
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

N1 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1",
      "mattr": ["+neon", "+dotprod"], "num-cores": 4}
N1_I8MM = {**N1, "mattr": ["+neon", "+dotprod", "+i8mm"]}
SM80 = {"kind": "cuda", "arch": "sm_80", "host": {"kind": "llvm"}}

FMLA_4S = re.compile(r"\bfmla\s+v\d+\.4s, v\d+\.4s, v\d+\.(4s|s\[\d\])")
USDOT = re.compile(r"\busdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b")
WRONG_DOT = re.compile(r"\b(sdot|udot)\s")


@functools.cache
def target(spec_key: str) -> Any:
    return tv.make_target({"N1": N1, "N1_I8MM": N1_I8MM, "SM80": SM80}[spec_key])


@functools.cache
def host() -> Any:
    return tv.make_target("host")


# --- traces covering every decision ------------------------------------------------------------


def _factorizations(extent: int, n: int) -> list[tuple[int, ...]]:
    if n == 1:
        return [(extent,)]
    return [(d, *rest) for d in range(1, extent + 1) if extent % d == 0
            for rest in _factorizations(extent // d, n - 1)]


def _all_decisions(inst: Any, decision: Any) -> list[Any]:
    """Every decision `inst` (a sampling instruction) can take; `decision` is one it took."""
    kind = inst.kind.name
    if kind == "SampleCategorical":
        return list(range(len(inst.attrs[0])))
    assert kind == "SamplePerfectTile", kind
    n, max_innermost = int(inst.attrs[0]), int(inst.attrs[1])
    extent = math.prod(int(x) for x in decision)  # the loop's extent
    return [list(f) for f in _factorizations(extent, n) if f[-1] <= max_innermost]


def covering_schedules(template: Any, workload: Any, tgt: Any, seeds: tuple[int, ...] = (1, 2),
                       drop: tuple[str, ...] = ()) -> list[Any]:
    """Schedules of `workload` by `template` in which each sampling instruction takes each of its
    possible decisions at least once (round r gives instruction i its (r + shift_i)-th decision,
    cycling), plus
    `template.apply` on `Schedule(mod, seed=s)` for `seeds`. `drop`: instruction kinds to leave out
    of the replayed traces (e.g. "Tensorize")."""
    base = tv.Schedule(workload.mod(), seed=1)
    template.apply(base, workload, tgt)
    trace = base.trace
    sampled = [inst for inst in trace.insts if inst in trace.decisions]
    assert sampled, "a template without knobs"
    choices = [_all_decisions(inst, trace.decisions[inst]) for inst in sampled]
    insts = [inst for inst in trace.insts if inst.kind.name not in drop]
    # instruction i starts at a different offset, so that the largest tiles do not all meet in
    # one round (an x86 build of that one takes seconds)
    shifts = [i * len(c) // len(sampled) for i, c in enumerate(choices)]
    out = []
    for r in range(max(len(c) for c in choices)):
        decisions = {inst: c[(r + k) % len(c)]
                     for inst, c, k in zip(sampled, choices, shifts, strict=True)}
        sch = tv.Schedule(workload.mod())
        tv.Trace(insts, decisions).apply_to_schedule(sch, remove_postproc=True)
        out.append(sch)
    for seed in seeds:
        sch = tv.Schedule(workload.mod(), seed=seed)
        template.apply(sch, workload, tgt)
        if drop:  # the same decisions, replayed without the dropped instructions
            tr = sch.trace
            sch = tv.Schedule(workload.mod())
            tv.Trace([i for i in tr.insts if i.kind.name not in drop],
                     {i: tr.decisions[i] for i in tr.insts if i in tr.decisions}
                     ).apply_to_schedule(sch, remove_postproc=True)
        out.append(sch)
    return out


def postprocessed(template: Any, workload: Any, tgt: Any, schedules: list[Any]) -> list[Any]:
    """Run the template's postprocessors (initialized by a TuneContext, as in a search) on each
    schedule; each must accept it."""
    ctx = tv.tune_context(workload.mod(), tgt, space=template.space(workload, tgt),
                          strategy="replay-trace", seed=1, num_threads=1)
    assert len(ctx.generate_design_space()) == 1
    for sch in schedules:
        for proc in ctx.space_generator.postprocs:
            assert proc.apply(sch), f"{type(proc).__name__} rejected {sch.trace}"
    return schedules


def run_on_host(mod: Any, workload: Any) -> list[np.ndarray]:
    rt = tv.compile_module(mod, host())
    dev = tv.tvm.cpu(0)
    inputs = workload.make_inputs(seed=0)
    outs = guarded.outputs([(s, d) for _, s, d in workload.arg_specs()[len(inputs):]], dev)
    rt["main"](*(tv.tvm.runtime.tensor(a, dev) for a in inputs), *(o.tensor for o in outs))
    return [o.numpy() for o in outs]


def assert_matches_reference(mod: Any, workload: Any) -> None:
    got = run_on_host(mod, workload)
    ref = workload.reference(workload.make_inputs(seed=0))
    rtol, atol = workload.tolerance()
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)


def aarch64_asm(mod: Any, tgt: Any) -> str:
    return tv.compile_module(mod, tgt).inspect_source("asm")


# --- registration and applicability ------------------------------------------------------------


def test_registered_with_knobs() -> None:
    spaces_for(parse_spec({"op": "dense", "shape": [16, 16, 16]}), host())  # loads the families
    for name in ("dense-neon-aarch64", "dense-int8-sdot-aarch64", "dense-wmma-cuda"):
        assert name in TEMPLATES
        d = TEMPLATES[name].describe()
        assert d["knobs"] and d["description"] and d["ops"]


def test_applies_only_to_their_targets() -> None:
    fp32 = parse_spec({"op": "dense", "shape": [16, 32, 24]})
    mm = parse_spec({"op": "matmul", "shape": [16, 32, 24]})
    fp16 = parse_spec({"op": "dense", "shape": [64, 64, 64], "dtype": "float16"})
    q = parse_spec({"op": "dense_int8", "shape": [8, 32, 64]})
    neon, usdot, wmma = (TEMPLATES[n] for n in ("dense-neon-aarch64", "dense-int8-sdot-aarch64",
                                                 "dense-wmma-cuda"))
    assert neon.applies(fp32, target("N1")) and neon.applies(mm, target("N1"))
    assert not neon.applies(fp32, host()) and not neon.applies(fp16, target("N1"))
    # uint8 x int8 has no exact dot-product instruction without i8mm (usdot)
    assert not usdot.applies(q, target("N1"))
    assert usdot.applies(q, target("N1_I8MM"))
    assert usdot.applies(q, tv.make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                            "mcpu": "neoverse-n2"}))
    assert not usdot.applies(q, host())
    assert wmma.applies(fp16, target("SM80")) and not wmma.applies(fp32, target("SM80"))
    assert not wmma.applies(fp16, tv.make_target({"kind": "cuda", "arch": "sm_61"}))
    assert not wmma.applies(parse_spec({"op": "dense", "shape": [64, 40, 64], "dtype": "float16"}),
                            target("SM80"))
    for name in ("dense-neon-aarch64", "dense-int8-sdot-aarch64", "dense-wmma-cuda"):
        assert name not in spaces_for(fp32, host())  # x86 keeps its own spaces
    conv = parse_spec({"op": "conv2d", "shape": [1, 16, 10, 10, 32, 3, 3]})
    for key in ("N1", "N1_I8MM", "SM80"):  # other ops: no template of these applies, no error
        assert spaces_for(conv, target(key)) == ["auto"] or all(
            n not in spaces_for(conv, target(key))
            for n in ("dense-neon-aarch64", "dense-int8-sdot-aarch64", "dense-wmma-cuda"))


# --- NEON fp32 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["dense", "matmul"])
def test_neon_fp32_every_knob_builds_with_fmla_and_is_right_on_x86(op: str) -> None:
    w = parse_spec({"op": op, "shape": [16, 32, 24]})
    tmpl, tgt = TEMPLATES["dense-neon-aarch64"], target("N1")
    schedules = postprocessed(tmpl, w, tgt, covering_schedules(tmpl, w, tgt))
    assert len(schedules) >= 14  # M=16 into 3 parts (mr <= 8) has 14 tilings
    for sch in schedules:
        asm = aarch64_asm(tv.strip_layout_rewrite(sch.mod), tgt)  # the timed kernel
        assert FMLA_4S.search(asm), sch.trace
        assert_matches_reference(sch.mod, w)  # packing included


@pytest.mark.parametrize("op", ["dense", "matmul"])
def test_neon_kernel_takes_the_documented_packed_weight(op: str) -> None:
    """The timed kernel (packing blocks stripped) takes the weight in [N/4, K, 4] panels."""
    w = parse_spec({"op": op, "shape": [16, 32, 24]})
    sch = tv.Schedule(w.mod(), seed=3)
    TEMPLATES["dense-neon-aarch64"].apply(sch, w, target("N1"))
    kernel = tv.strip_layout_rewrite(sch.mod)
    assert tv.param_specs(kernel)[1] == ((32 // 4, 24, 4), "float32")
    x, wt = w.make_inputs(seed=0)
    w_nk = wt if op == "dense" else wt.T  # [N, K]
    packed = np.ascontiguousarray(w_nk.reshape(8, 4, 24).transpose(0, 2, 1))
    rt, dev = tv.compile_module(kernel, host()), tv.tvm.cpu(0)
    out = tv.tvm.runtime.tensor(np.zeros((16, 32), "float32"), dev)
    rt["main"](tv.tvm.runtime.tensor(x, dev), tv.tvm.runtime.tensor(packed, dev), out)
    np.testing.assert_allclose(out.numpy(), w.reference([x, wt])[0], rtol=1e-4, atol=1e-4)


# --- int8 usdot --------------------------------------------------------------------------------


def test_int8_every_knob_builds_with_usdot() -> None:
    w = parse_spec({"op": "dense_int8", "shape": [8, 32, 64]})
    tmpl, tgt = TEMPLATES["dense-int8-sdot-aarch64"], target("N1_I8MM")
    schedules = postprocessed(tmpl, w, tgt, covering_schedules(tmpl, w, tgt))
    assert len(schedules) >= 10
    for sch in schedules:
        asm = aarch64_asm(tv.strip_layout_rewrite(sch.mod), tgt)
        assert USDOT.search(asm), sch.trace
        assert not WRONG_DOT.search(asm)  # sdot/udot would be wrong for uint8 x int8
    # neoverse-n2 has i8mm (and SVE): still usdot
    n2 = tv.make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n2"})
    assert USDOT.search(aarch64_asm(schedules[0].mod, n2))


def test_int8_loop_nest_without_tensorize_is_exact_on_x86() -> None:
    """Not the usdot instruction (AArch64 only), but the packing, tiling and indexing around it."""
    w = parse_spec({"op": "dense_int8", "shape": [8, 32, 64]})
    tmpl, tgt = TEMPLATES["dense-int8-sdot-aarch64"], target("N1_I8MM")
    schedules = covering_schedules(tmpl, w, tgt, seeds=(1,), drop=("Tensorize",))
    for sch in postprocessed(tmpl, w, tgt, schedules):
        assert "Tensorize" not in str(sch.trace)
        assert_matches_reference(sch.mod, w)


def test_int8_tensorized_tile_is_the_contiguous_packed_tile() -> None:
    w = parse_spec({"op": "dense_int8", "shape": [8, 32, 64]})
    sch = tv.Schedule(w.mod(), seed=2)
    TEMPLATES["dense-int8-sdot-aarch64"].apply(sch, w, target("N1_I8MM"))
    kernel = tv.strip_layout_rewrite(sch.mod)
    assert tv.param_specs(kernel)[1] == ((32 // 4, 64 // 4, 4, 4), "int8")
    script = kernel["main"].script()
    # the intrinsic's B operand is a whole trailing [4, 4] tile of the packed weight
    assert re.search(r"match_buffer\(W(_global)?\[\w+, \w+, 0:4, 0:4\], \(4, 4\), \"int8\"", script)
    assert "llvm.aarch64.neon.usdot" in script


def test_traces_replay_from_json() -> None:
    """What a worker does with a stored record: replay the JSON trace onto a fresh module."""
    for name, spec, key in (("dense-neon-aarch64", {"op": "dense", "shape": [16, 32, 24]}, "N1"),
                            ("dense-int8-sdot-aarch64", {"op": "dense_int8", "shape": [8, 32, 64]},
                             "N1_I8MM"),
                            ("dense-wmma-cuda", {"op": "dense", "shape": [64, 64, 32],
                                                 "dtype": "float16"}, "SM80")):
        w = parse_spec(spec)
        sch = tv.Schedule(w.mod(), seed=4)
        TEMPLATES[name].apply(sch, w, target(key))
        again = tv.apply_trace(w.mod(), tv.trace_to_json(sch.trace))
        assert tv.structural_equal(again.mod, sch.mod)


# --- optional: run the AArch64 kernels under qemu-user -----------------------------------------

# Calls the compiled PackedFunc (`__tvm_ffi_main`, TVM 0.27's ABI) with DLTensor arguments read
# from a file and writes all of them back; the TVM runtime hooks the object needs are stubbed
# (parallel launch runs its tasks one after the other).
QEMU_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int, Env*, void*);
static int launch(Lambda f, void* cdata, int num_task) {
  Env env = {0, 3};
  for (int t = 0; t < env.num_task; ++t) if (f(t, &env, cdata)) return -1;
  return 0;
}
static void* alloc_ws(int dt, int di, uint64_t n, int c, int b) {
  return aligned_alloc(64, (n + 63) / 64 * 64);
}
static int free_ws(int dt, int di, void* p) { free(p); return 0; }
void* __TVMBackendParallelLaunch = (void*)launch;
void* __TVMBackendAllocWorkspace = (void*)alloc_ws;
void* __TVMBackendFreeWorkspace = (void*)free_ws;
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "%s: ", kind);
  for (int i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}
int __tvm_ffi_main(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb");
  int32_t n, head[3];
  if (fread(&n, 4, 1, f) != 1) return 2;
  TVMFFIAny* args = calloc(n, sizeof(TVMFFIAny));
  DLTensor* ts = calloc(n, sizeof(DLTensor));
  size_t* bytes = calloc(n, sizeof(size_t));
  for (int i = 0; i < n; ++i) {
    if (fread(head, 4, 3, f) != 3) return 2;
    int64_t* shape = calloc(head[0], 8);
    if (fread(shape, 8, head[0], f) != (size_t)head[0]) return 2;
    bytes[i] = head[2] / 8;
    for (int d = 0; d < head[0]; ++d) bytes[i] *= shape[d];
    DLDataType dt = {(uint8_t)head[1], (uint8_t)head[2], 1};
    ts[i] = (DLTensor){aligned_alloc(64, (bytes[i] + 63) / 64 * 64), {kDLCPU, 0}, head[0], dt,
                       shape, NULL, 0};
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &ts[i];
  }
  for (int i = 0; i < n; ++i) if (fread(ts[i].data, 1, bytes[i], f) != bytes[i]) return 2;
  fclose(f);
  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  if (__tvm_ffi_main(NULL, args, n, &result) != 0) return 3;
  f = fopen(argv[2], "wb");
  for (int i = 0; i < n; ++i) fwrite(ts[i].data, 1, bytes[i], f);
  return fclose(f);
}
"""
DL_CODES = {"int": 0, "uint": 1, "float": 2}


def _qemu_problem() -> str | None:
    for exe, pkg in (("qemu-aarch64", "qemu-user"),
                     ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")):
        if shutil.which(exe) is None:
            return f"{exe} is not installed (Debian package {pkg}, plus libc6-dev-arm64-cross)"
    return None


def run_under_qemu(mod: Any, tgt: Any, arrays: list[np.ndarray], tmp: Any) -> list[np.ndarray]:
    """Build `mod` for AArch64, link it with QEMU_HARNESS and run it on `arrays` (all params)."""
    tv.compile_module(mod, tgt).write_to_file(str(tmp / "kernel.o"))
    if not (tmp / "harness.o").exists():
        (tmp / "harness.c").write_text(QEMU_HARNESS)
        subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-c", "harness.c",
                        f"-I{tv.tvm_ffi.libinfo.find_include_path()}"], cwd=tmp, check=True)
    subprocess.run(["aarch64-linux-gnu-gcc", "-static", "harness.o", "kernel.o", "-o", "kernel",
                    "-lm"], cwd=tmp, check=True)
    with open(tmp / "in.bin", "wb") as f:
        f.write(np.int32(len(arrays)).tobytes())
        for a in arrays:
            code = DL_CODES[re.sub(r"\d+", "", a.dtype.name)]
            f.write(np.array([a.ndim, code, a.dtype.itemsize * 8], np.int32).tobytes())
            f.write(np.array(a.shape, np.int64).tobytes())
        for a in arrays:
            f.write(np.ascontiguousarray(a).tobytes())
    run = subprocess.run(["qemu-aarch64", "-cpu", "max", "./kernel", "in.bin", "out.bin"],
                         cwd=tmp, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    raw, out, off = (tmp / "out.bin").read_bytes(), [], 0
    for a in arrays:
        out.append(np.frombuffer(raw[off:off + a.nbytes], a.dtype).reshape(a.shape))
        off += a.nbytes
    return out


def _relax_task(kind: str) -> dict[str, Any]:
    """A relax model's task as a `tir` spec (int64 indices, a bound weight, its epilogue)."""
    from bench import fused

    func = (fused.linear(12, 32, 20, "relu", residual=True) if kind == "linear"
            else fused.int8_linear(12, 32, 36))
    return {"op": "tir", "tvmscript": func.script()}


@pytest.mark.parametrize(("name", "spec", "key"), [
    ("dense-int8-sdot-aarch64", {"op": "dense_int8", "shape": [12, 40, 36]}, "N1_I8MM"),
    ("dense-neon-aarch64", {"op": "dense", "shape": [16, 32, 24]}, "N1"),
    ("dense-neon-aarch64", {"op": "matmul", "shape": [12, 40, 20]}, "N1"),
    # relax's fused tasks, matched by structure: bias + ReLU + residual, and a requantization
    ("dense-neon-aarch64", "linear", "N1"),
    ("dense-int8-sdot-aarch64", "int8_linear", "N1_I8MM"),
])
def test_aarch64_kernels_are_right_under_qemu(name: str, spec: dict[str, Any] | str, key: str,
                                              tmp_path: Any) -> None:
    """Optional (skipped without qemu-user and an AArch64 gcc): the real AArch64 kernels,
    usdot included, on full-range inputs, against numpy; `-cpu max` has NEON, dotprod, i8mm."""
    problem = _qemu_problem()
    if problem is not None:
        pytest.skip(f"AArch64 kernels not run: {problem}")
    w = parse_spec(_relax_task(spec) if isinstance(spec, str) else spec)
    tmpl, tgt = TEMPLATES[name], target(key)
    assert registry.resolve("default", w, tgt) == name
    schedules = covering_schedules(tmpl, w, tgt, seeds=(1,))
    inputs = w.make_inputs(seed=0)
    ref = w.reference(inputs)
    rtol, atol = w.tolerance()
    for sch in postprocessed(tmpl, w, tgt, schedules[::4] + schedules[-1:]):
        outs = [np.zeros(shape, dt) for _, shape, dt in w.arg_specs()[len(inputs):]]
        got = run_under_qemu(sch.mod, tgt, [*inputs, *outs], tmp_path)[len(inputs):]
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=str(sch.trace))


# --- CUDA wmma ---------------------------------------------------------------------------------


def _nvcc_problem() -> str | None:
    exe = shutil.which("nvcc")
    if exe is None:
        return "nvcc is not on PATH"
    try:
        subprocess.run([exe, "--version"], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvcc cannot be run: {exc}"
    return None


def test_wmma_every_knob_builds_to_mma_sync_ptx() -> None:
    w = parse_spec({"op": "dense", "shape": [256, 128, 64], "dtype": "float16"})
    tmpl, tgt = TEMPLATES["dense-wmma-cuda"], target("SM80")
    assert cuda.warp_choices(256 // 16) == [1, 2, 4]
    schedules = postprocessed(tmpl, w, tgt, covering_schedules(tmpl, w, tgt))
    # the same space under a target with the GPU limits, which adds VerifyGPUCode
    limited = tv.make_target({**SM80, "max_threads_per_block": 1024,
                              "max_shared_memory_per_block": 49152})
    postprocessed(tmpl, w, limited, covering_schedules(tmpl, w, limited, seeds=()))
    sources = []
    for sch in schedules:
        ex = tv.tvm.compile(sch.mod, target=tgt)
        src = ex.mod.imports[0].inspect_source("")
        assert "nvcuda::wmma::mma_sync" in src and "__shared__" in src
        sources.append(src)
    problem = _nvcc_problem()
    if problem is not None:
        pytest.skip(f"CUDA sources built; PTX not checked: {problem}")
    with tgt:
        for src in sources:
            ptx = tv.tvm.support.nvcc.compile_cuda(src, target_format="ptx", arch="sm_80",
                                                   compiler="nvcc")
            text = bytes(ptx).decode() if not isinstance(ptx, str) else ptx
            assert "wmma.mma.sync" in text
            assert ".f16.f16" in text  # fp16 accumulation, as the workload computes
