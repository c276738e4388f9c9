"""results.json and results.md: machine info, one row per workload, the suite's geometric mean;
models.md: one row per model of the model suite."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from . import seeds

# tunefarm's kernel again, called from a Python loop as PyTorch and numpy are (bench.timing):
# "same loop" is its ratio to PyTorch, "dispatch µs" what the Python call adds to the C++ loop's
PYLOOP = "tunefarm-pyloop"
VARIANTS = ("tunefarm", "metaschedule", "pytorch", "numpy", PYLOOP)
BUSY_LOAD = 0.5  # 1-minute load average above which the machine was not idle
COLUMNS = ["workload", "tunefarm ms (GFLOPS)", "MS ms (GFLOPS)", "PyTorch", "numpy", "% of peak",
           "best round", "tunefarm/MS", "tunefarm/PyTorch", "same loop", "dispatch µs",
           "tuning s tunefarm / MS"]


def _cpu() -> dict[str, Any]:
    info: dict[str, Any] = {"logical_cpus": os.cpu_count(), "machine": platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if key == "model name" and "model" not in info:
            info["model"] = val
        elif key == "cpu MHz" and "mhz" not in info:
            info["mhz"] = float(val)
        elif key == "flags" and "isa" not in info:
            flags = set(val.split())
            info["isa"] = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni",
                                       "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return info


def _git(repo: Path) -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{' (uncommitted changes)' if dirty else ''}" if head else None


def machine_info(target: dict[str, Any], threads: int, torch: Any) -> dict[str, Any]:
    import numpy as np

    from tuner.core import tvm_api as tv

    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]["name"]  # type: ignore[attr-defined]
    except (AttributeError, KeyError, TypeError):
        blas = None
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "cpu": _cpu(), "threads": threads, "target": target,
        "env": {k: os.environ.get(k) for k in ("TVM_NUM_THREADS", "OMP_NUM_THREADS",
                                               "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                               "TVM_BIND_THREADS")},
        "versions": {"python": platform.python_version(), "tvm": tv.tvm_version(),
                     "numpy": np.__version__, "numpy_blas": blas,
                     "torch": getattr(torch, "__version__", None) if torch else None},
        "tunefarm_git": _git(Path(__file__).resolve().parent.parent),
        "loadavg_start": loadavg(),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _ms(s: float | None) -> str:
    if s is None:
        return "–"
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 \
        else f"{ms:.3g}"


def _gf(g: float | None) -> str:
    return "" if g is None else f" ({g:.0f})" if g >= 10 else f" ({g:.1f})"


def cell(v: dict[str, Any] | None, flops: int, show_gflops: bool = True) -> str:
    if not v or v.get("status") in (None, "unavailable"):
        return "–"
    if v["status"] == "no valid kernel":
        return "no valid kernel"
    if v["status"] == "error":
        return "error"
    text = _ms(v["median_s"]) + (_gf(v.get("gflops")) if show_gflops else "")
    return text if v["status"] == "ok" else f"**WRONG** {text}"


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """Latency ratio a/b (< 1: a is faster); None unless both ran and were checked correct."""
    if not a or not b or a.get("status") != "ok" or b.get("status") != "ok":
        return None
    return a["median_s"] / b["median_s"] if a["median_s"] and b["median_s"] else None


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    r = [w["ratios"]["tunefarm/metaschedule"] for w in rows if w.get("ratios")]
    p = [w["ratios"]["tunefarm/pytorch"] for w in rows if w.get("ratios")]
    same = [w["ratios"].get("tunefarm/pytorch, same loop") for w in rows if w.get("ratios")]
    g_ms = geomean([x for x in r if x is not None])
    g_pt = geomean([x for x in p if x is not None])
    return {"geomean_tunefarm_over_metaschedule": g_ms,
            "n_tunefarm_over_metaschedule": sum(x is not None for x in r),
            "geomean_tunefarm_over_pytorch": g_pt,
            "n_tunefarm_over_pytorch": sum(x is not None for x in p),
            "geomean_tunefarm_over_pytorch_same_loop": geomean([x for x in same if x]),
            "wrong_outputs": [f"{w['id']}:{k}" for w in rows
                              for k, v in w.get("variants", {}).items()
                              if v.get("status") == "WRONG"]}


def _busy(m: dict[str, Any]) -> list[str]:
    loads = [x for x in (m.get("loadavg_start"), m.get("loadavg_end")) if x]
    if any(x[0] > BUSY_LOAD for x in loads):
        return ["", f"**Warning: the machine was not idle** (1-minute load average "
                    f"{' / '.join(str(x[0]) for x in loads)}): multi-threaded timings are "
                    f"unreliable; rerun on an idle machine."]
    return []


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def markdown(doc: dict[str, Any]) -> str:
    m, cfg = doc["machine"], doc["config"]
    cpu, ver = m["cpu"], m["versions"]
    lines = [f"# tunefarm benchmark: suite `{cfg['suite']}`, {cfg['trials']} trials", "",
             f"Measured {m['date']} on {cpu.get('model', '?')} ({cpu.get('logical_cpus')} logical "
             f"CPUs, ISA {', '.join(cpu.get('isa', []))}), {m['threads']} threads everywhere "
             f"(TVM_NUM_THREADS={m['env']['TVM_NUM_THREADS']}, torch.set_num_threads, "
             f"OPENBLAS_NUM_THREADS). Target `{json.dumps(m['target'])}`.",
             f"{ver['tvm']}, numpy {ver['numpy']} ({ver['numpy_blas']}), torch {ver['torch']}, "
             f"Python {ver['python']}; tunefarm {m['tunefarm_git']}. Load average at start "
             f"{m['loadavg_start']}, at end {m.get('loadavg_end')}.", "",
             f"Final timings: all variants in one process, interleaved, median of "
             f"{cfg['rounds']} rounds, each timing >= {cfg['min_ms']:g} ms of repeated calls; "
             f"every output checked against the workload's reference. Latency in ms (GFLOPS in "
             f"brackets; int8 counts integer ops). Peak: fp32 {cfg['peak']['fp32']:g} GFLOPS, "
             f"int8 {cfg['peak']['int8']:g} GOPS"
             f"{_bf16_peak(cfg['peak'])}; \"best round\": tunefarm's % of peak in its "
             f"fastest round (undisturbed by other tenants, as peak.c's best of three). "
             f"Ratios are latency ratios (< 1: tunefarm is faster). Packed weights are "
             f"excluded from the timed kernels (see bench/README.md).",
             *_busy(m), "", "| " + " | ".join(COLUMNS) + " |",
             "|---|" + "---:|" * (len(COLUMNS) - 1)]
    for w in doc["workloads"]:
        v, flops = w.get("variants", {}), w["flops"]
        tf, ms = w.get("tuning", {}).get("tunefarm"), w.get("tuning", {}).get("metaschedule")
        gfl = w.get("peak") is not None
        tune = f"{_f(tf and tf.get('wall_s'), '{:.0f}')} / {_f(ms and ms.get('wall_s'), '{:.0f}')}"
        pct = w.get("pct_of_peak")
        lines.append("| " + " | ".join([
            f"{w['id']} {w['title']}", cell(v.get("tunefarm"), flops, gfl),
            cell(v.get("metaschedule"), flops, gfl), cell(v.get("pytorch"), flops, gfl),
            cell(v.get("numpy"), flops, gfl), _f(pct, "{:.0f}%"),
            _f(w.get("pct_of_peak_best_round"), "{:.0f}%"),
            _f(w["ratios"].get("tunefarm/metaschedule")),
            _f(w["ratios"].get("tunefarm/pytorch")),
            _f(w["ratios"].get("tunefarm/pytorch, same loop")),
            _f(w.get("dispatch_s") and w["dispatch_s"] * 1e6, "{:.1f}"), tune]) + " |")
    s = doc["summary"]
    lines += ["", f"**Geometric mean of tunefarm/MS** over {s['n_tunefarm_over_metaschedule']} "
                  f"workloads: {_f(s['geomean_tunefarm_over_metaschedule'], '{:.3f}')} "
                  f"(tunefarm/PyTorch over {s['n_tunefarm_over_pytorch']}: "
                  f"{_f(s['geomean_tunefarm_over_pytorch'], '{:.3f}')}; both called from "
                  f"Python loops: "
                  f"{_f(s.get('geomean_tunefarm_over_pytorch_same_loop'), '{:.3f}')})."]
    if s["wrong_outputs"]:
        lines += ["", f"**WRONG OUTPUTS: {', '.join(s['wrong_outputs'])}** (see results.json)."]
    notes = []
    for w in doc["workloads"]:
        tuned = [f"{k} failed in {t.get('space', '?')}" if t.get("error") else
                 f"{k} {t.get('valid')}/{t.get('trials_done')} valid in {t.get('space')}"
                 for k, t in w.get("tuning", {}).items() if t]
        if tuned:
            notes.append(f"- {w['id']} tuning: {'; '.join(tuned)}")
        for name, v in w.get("variants", {}).items():
            why = v.get("reason") or v.get("check_error")
            if v.get("status") in ("error", "no valid kernel", "WRONG") and why:
                notes.append(f"- {w['id']} {name}: {v['status']}: {why}")
            if v.get("packed"):
                shapes = "; ".join(f"{', '.join(p['from'])} -> {p['packed_shape']}"
                                   for p in v["packed"])
                notes.append(f"- {w['id']} {name}: weight pre-packed (not timed): {shapes}")
            if v.get("packing_timed"):
                notes.append(f"- {w['id']} {name}: the packing of runtime input(s) "
                             f"{', '.join(v['packing_timed'])} is timed in every call (the "
                             f"search measured its candidates without it)")
        if w.get("error"):
            notes.append(f"- {w['id']}: {w['error']}")
    notes += [f"- {w['id']} pytorch: {w['variants']['pytorch']['note']}" for w in doc["workloads"]
              if w.get("variants", {}).get("pytorch", {}).get("note")
              and w["op"] == "dense_int8"]
    if notes:
        lines += ["", "Notes", *notes]
    return "\n".join(lines) + "\n"


def write(out: Path, doc: dict[str, Any]) -> None:
    doc["summary"] = summarize(doc["workloads"])
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "results.md").write_text(markdown(doc))


def _bf16_peak(peak: dict[str, Any]) -> str:
    """", bf16 N GFLOPS" where the run had it (results of runs before --peak-bf16 have none)."""
    return f", bf16 {peak['bf16']:g} GFLOPS" if peak.get("bf16") else ""


def model_ms(x: float | None) -> str:
    """A model's latency in models.md and the report: "10.357 ms", or "-" for none."""
    return f"{x * 1e3:.3f} ms" if x else "-"


def models_table(results: dict[str, Any]) -> str:
    """models.md: a row per model (a tuner run with several seeds: their median and spread)."""
    lines = ["| model | tasks | tunefarm | MetaSchedule | tf/MS | untuned | PyTorch | "
             "best torch.compile | tf tuning s | MS tuning s |", "|" + "---|" * 10]
    for name, r in results.items():
        t = {k: v.get("median_s") for k, v in r["timing"].items()}
        t.update({k: seeds.median_s(r, k) for k in seeds.TUNERS})
        tuned = seeds.tuned(r)
        tuning_s = {tuner: "/".join(f"{v.get('tuning_s', 0):.0f}" for k, v in tuned.items()
                                    if seeds.tuner_of(k) == tuner) or "0"
                    for tuner in seeds.TUNERS}
        ratio = (f"{t['tunefarm'] / t['metaschedule']:.2f}"
                 if t.get("tunefarm") and t.get("metaschedule") else "-")
        eager = [v for k, v in t.items() if k.startswith("pytorch") and v]  # bf16: + autocast
        t["pytorch"] = min(eager) if eager else None
        compiled = [v for k, v in t.items() if k.startswith("torch.compile") and v]
        t["torch.compile"] = min(compiled) if compiled else None  # the best variant
        lines.append(f"| {name} ({r['scale']}) | {r['tasks']} | {model_ms(t.get('tunefarm'))}"
                     f"{seeds.spread(r, 'tunefarm')} | {model_ms(t.get('metaschedule'))}"
                     f"{seeds.spread(r, 'metaschedule')} | {ratio} | "
                     f"{model_ms(t.get('tvm-untuned'))} | {model_ms(t.get('pytorch'))} | "
                     f"{model_ms(t.get('torch.compile'))} | {tuning_s['tunefarm']} | "
                     f"{tuning_s['metaschedule']} |")
    return "\n".join(lines) + "\n"
