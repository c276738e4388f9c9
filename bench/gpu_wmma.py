"""Numerics and speed of the `dense-wmma-cuda` template on a real GPU (not a test; run by hand).

There is no GPU on the development machines, and TVM is not installed on the lent GPU machines,
so the check has two halves:

    python -m bench.gpu_wmma export DIR [--shape 1024,1024,1024] [--samples 6] [--arch sm_90]
        (here, with TVM) samples schedules from the template's space, compiles each to CUDA C++,
        and writes DIR/k<i>.cu plus DIR/kernels.json (launch dimensions, argument order);
    python bench/gpu_wmma.py run DIR
        (on the GPU machine: CuPy and nvcc only) compiles each kernel with nvcc for the arch,
        runs it on random fp16 data, checks it against cuBLAS (CuPy's matmul, fp32 accumulation),
        and times it against cuBLAS with CUDA events.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


def export(out: Path, shape: list[int], samples: int, arch: str) -> None:
    from schedules.registry import TEMPLATES, space_names
    from tuner.core import tvm_api as tv
    from tuner.workloads import parse_spec

    space_names()  # registers the templates
    wl = parse_spec({"op": "dense", "shape": shape, "dtype": "float16"})
    tgt = tv.make_target({"kind": "cuda", "arch": arch, "host": {"kind": "llvm"},
                          "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152})
    tmpl = TEMPLATES["dense-wmma-cuda"]
    ctx = tv.tune_context(wl.mod(), tgt, space=tmpl.space(wl, tgt), strategy="replay-trace",
                          seed=1, num_threads=1)
    out.mkdir(parents=True, exist_ok=True)
    kernels = []
    for seed in range(1, samples + 1):
        sch = tv.Schedule(wl.mod(), seed=seed)
        tmpl.apply(sch, wl, tgt)
        if not all(p.apply(sch) for p in ctx.space_generator.postprocs):
            continue
        src = tv.tvm.compile(sch.mod, target=tgt).mod.imports[0].inspect_source("")
        sig = re.search(r"__global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)", src)
        assert sig is not None, "no kernel in the CUDA source"
        binds = {tag: int(n) for n, tag in re.findall(
            r'T\.thread_binding\((\d+), thread="(\w+\.\w)"', sch.mod.script())}
        args = [a.split()[-1].removesuffix("_ptr") for a in sig.group(3).split(",")]
        name = f"k{seed}"
        (out / f"{name}.cu").write_text(src)
        kernels.append({"name": name, "func": sig.group(2), "threads": int(sig.group(1)),
                        "grid": [binds.get("blockIdx.x", 1), binds.get("blockIdx.y", 1),
                                 binds.get("blockIdx.z", 1)],
                        "block": [binds.get("threadIdx.x", 1), binds.get("threadIdx.y", 1),
                                  binds.get("threadIdx.z", 1)],
                        "args": args, "decisions": tv.trace_decisions(sch.trace)})
    (out / "kernels.json").write_text(json.dumps({"shape": shape, "arch": arch,
                                                  "kernels": kernels}, indent=1))
    print(f"{len(kernels)} kernels written to {out}")


def run(src_dir: Path) -> int:
    import cupy as cp

    meta = json.loads((src_dir / "kernels.json").read_text())
    m, n, k = meta["shape"]
    rng = cp.random.default_rng(0)
    x = (rng.standard_normal((m, k), dtype=cp.float32) / 4).astype(cp.float16)
    w = (rng.standard_normal((n, k), dtype=cp.float32) / 4).astype(cp.float16)
    ref = x.astype(cp.float32) @ w.astype(cp.float32).T
    flops = 2 * m * n * k

    def time_ms(fn: Any, reps: int = 50) -> float:
        fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return float(cp.cuda.get_elapsed_time(start, stop)) / reps

    wt = cp.ascontiguousarray(w.T)
    cublas = min(time_ms(lambda: x @ w.T), time_ms(lambda: x @ wt))  # the faster layout
    print(f"cuBLAS fp16 {m}x{n}x{k}: {cublas * 1e3:.1f} us ({flops / cublas / 1e9:.1f} TFLOPS)")
    bad = 0
    for kern in meta["kernels"]:
        cubin = src_dir / f"{kern['name']}.cubin"
        subprocess.run(["nvcc", "-cubin", f"-arch={meta['arch']}", "-diag-suppress", "177",
                        "-o", str(cubin),
                        str(src_dir / f"{kern['name']}.cu")], check=True)
        fn = cp.RawModule(path=str(cubin)).get_function(kern["func"])
        y = cp.zeros((m, n), dtype=cp.float16)
        bufs = {"X": x, "W": w}
        args = [bufs.get(a, y) for a in kern["args"]]
        launch = functools.partial(fn, tuple(kern["grid"]), tuple(kern["block"]), tuple(args))
        launch()
        cp.cuda.Device().synchronize()
        err = float(cp.max(cp.abs(y.astype(cp.float32) - ref)))
        scale = float(cp.max(cp.abs(ref)))
        ok = err <= 2e-2 * scale + 1e-2  # fp16 accumulation over K terms
        bad += not ok
        ms = time_ms(launch)
        print(f"{kern['name']}: grid {kern['grid']} block {kern['block']}  max|err| {err:.4f} "
              f"(max|ref| {scale:.1f}) {'ok' if ok else 'WRONG'}  {ms * 1e3:.1f} us "
              f"({flops / ms / 1e9:.1f} TFLOPS, {cublas / ms:.2f}x cuBLAS)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.gpu_wmma", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("dir", type=Path)
    e.add_argument("--shape", default="1024,1024,1024")
    e.add_argument("--samples", type=int, default=6)
    e.add_argument("--arch", default="sm_90")
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "export":
        export(a.dir, [int(v) for v in a.shape.split(",")], a.samples, a.arch)
        return 0
    return run(a.dir)


if __name__ == "__main__":
    sys.exit(main())
