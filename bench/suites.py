"""Benchmark suites: named lists of workloads (`public`, `tiny`, `fused`: bench/fused.py) or a JSON
file of the same shape.

A suite entry: {"id": "P1", "title": "matmul 1024³", "spec": {...tuner.workloads spec...},
"peak": "fp32" | "int8" | "bf16" | null}. `peak` names the compute peak the workload is compared
with; null (softmax) means no meaningful FLOP peak: the "% of peak" column shows "–".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PUBLIC: list[dict[str, Any]] = [
    {"id": "P1", "title": "matmul 1024³", "peak": "fp32",
     "spec": {"op": "matmul", "shape": [1024, 1024, 1024]}},
    {"id": "P2", "title": "dense 128×768·(3072×768)ᵀ", "peak": "fp32",
     "spec": {"op": "dense", "shape": [128, 3072, 768]}},
    {"id": "P3", "title": "bmm (12,128,64)·ᵀ", "peak": "fp32",
     "spec": {"op": "batch_matmul", "shape": [12, 128, 128, 64]}},
    {"id": "P4", "title": "conv2d 3×3, 64→64, 56²", "peak": "fp32",
     "spec": {"op": "conv2d", "shape": [1, 64, 56, 56, 64, 3, 3], "padding": 1}},
    {"id": "P5", "title": "conv2d 1×1, 256→64, 56²", "peak": "fp32",
     "spec": {"op": "conv2d", "shape": [1, 256, 56, 56, 64, 1, 1]}},
    {"id": "P6", "title": "depthwise 3×3, 32ch, 112²", "peak": "fp32",
     "spec": {"op": "depthwise_conv2d", "shape": [1, 32, 112, 112, 3, 3], "padding": 1}},
    {"id": "P7", "title": "dense int8 128×768·(768×768)ᵀ", "peak": "int8",
     "spec": {"op": "dense_int8", "shape": [128, 768, 768]}},
    {"id": "P8", "title": "softmax rows of 1536×128", "peak": None,
     "spec": {"op": "softmax", "shape": [1536, 128]}},
]

# seconds-scale shapes of the same ops, for trying the harness out
TINY: list[dict[str, Any]] = [
    {"id": "T1", "title": "matmul 64³", "peak": "fp32",
     "spec": {"op": "matmul", "shape": [64, 64, 64]}},
    {"id": "T2", "title": "dense 16×64·(64×64)ᵀ", "peak": "fp32",
     "spec": {"op": "dense", "shape": [16, 64, 64]}},
    {"id": "T3", "title": "conv2d 3×3, 8→8, 16²", "peak": "fp32",
     "spec": {"op": "conv2d", "shape": [1, 8, 16, 16, 8, 3, 3], "padding": 1}},
    {"id": "T4", "title": "dense int8 16×64·(64×64)ᵀ", "peak": "int8",
     "spec": {"op": "dense_int8", "shape": [16, 64, 64]}},
    {"id": "T5", "title": "softmax rows of 64×32", "peak": None,
     "spec": {"op": "softmax", "shape": [64, 32]}},
    {"id": "T6", "title": "bmm (2,16,8)·(2,16,8)ᵀ", "peak": "fp32",
     "spec": {"op": "batch_matmul", "shape": [2, 16, 16, 8]}},
    {"id": "T7", "title": "depthwise 3×3, 4ch, 16²", "peak": "fp32",
     "spec": {"op": "depthwise_conv2d", "shape": [1, 4, 16, 16, 3, 3], "padding": 1}},
]

# bf16 GEMMs (fp32 sums) beside the same GEMMs in fp32: issue 56's "bf16 >= 1.6x fp32 on
# AVX512-BF16" (on AMX: ">= 50% of the AMX probe") and its comparison with PyTorch's bf16 GEMM
# (oneDNN)
LOWP: list[dict[str, Any]] = [
    {"id": f"L{i}", "title": f"dense {dt} {title}", "peak": "bf16" if dt == "bf16" else "fp32",
     "spec": {"op": "dense", "shape": shape, "dtype": "bfloat16" if dt == "bf16" else "float32"}}
    for i, (dt, title, shape) in enumerate([
        ("bf16", "1024³", [1024, 1024, 1024]), ("fp32", "1024³", [1024, 1024, 1024]),
        ("bf16", "2048³", [2048, 2048, 2048]), ("fp32", "2048³", [2048, 2048, 2048]),
        ("bf16", "128×768·(3072×768)ᵀ", [128, 3072, 768]),
        ("fp32", "128×768·(3072×768)ᵀ", [128, 3072, 768])], start=1)] + [
    # int8 beside them: AMX's tdpbusd against VNNI (issue 56's "int8 GEMM on AMX at >= 50% of
    # the int8 probe") and PyTorch's torch._int_mm
    {"id": f"L{i}", "title": f"dense int8 {title}", "peak": "int8",
     "spec": {"op": "dense_int8", "shape": shape}}
    for i, (title, shape) in enumerate([("1024³", [1024, 1024, 1024]),
                                        ("128×768·(3072×768)ᵀ", [128, 3072, 768])], start=7)]


def _fused() -> list[dict[str, Any]]:
    from .fused import FUSED, spec_of  # builds the relax models: TVM

    return [{**e, "spec": spec_of(e["model"])} for e in FUSED]


SUITES: dict[str, Any] = {"public": PUBLIC, "tiny": TINY, "lowp": LOWP, "fused": _fused}


def load_suite(name: str) -> list[dict[str, Any]]:
    """A built-in suite by name, or a JSON file: a list of entries or {"workloads": [...]}."""
    if name in SUITES:
        entries = SUITES[name]() if callable(SUITES[name]) else SUITES[name]
    else:
        path = Path(name)
        if not path.is_file():
            raise SystemExit(f"unknown suite {name!r}: use {', '.join(SUITES)} or a JSON file")
        data = json.loads(path.read_text())
        entries = data["workloads"] if isinstance(data, dict) else data
    out = []
    for i, e in enumerate(entries):
        if "spec" not in e and isinstance(e.get("model"), dict):  # a relax task (bench/fused.py)
            from .fused import spec_of

            e = {**e, "spec": spec_of(e["model"])}
        if "spec" not in e:
            raise SystemExit(f"suite entry {i} has no 'spec' (nor a relax 'model'): {e}")
        out.append({"id": str(e.get("id", f"W{i + 1}")), "title": e.get("title"),
                    "peak": e.get("peak", "fp32"), "spec": dict(e["spec"]),
                    **({"model": e["model"]} if "model" in e else {})})
    ids = [e["id"] for e in out]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"duplicate workload ids in suite {name!r}: {ids}")
    return out


def select(entries: list[dict[str, Any]], only: str | None) -> list[dict[str, Any]]:
    if not only:
        return entries
    want = [w.strip() for w in only.split(",") if w.strip()]
    unknown = sorted(set(want) - {e["id"] for e in entries})
    if unknown:
        raise SystemExit(f"--only: no workload {', '.join(unknown)} in the suite "
                         f"({', '.join(e['id'] for e in entries)})")
    return [e for e in entries if e["id"] in want]
