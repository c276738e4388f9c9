"""`python -m bench report --out DIR`: one page, `DIR/report.md`, with PNG plots in `DIR/plots/`,
from what a run wrote into DIR: `results.json` (an op suite: public, fused, off-grid) and
`models.json` (the model suite).

- Latency of every variant (tunefarm, MetaSchedule, PyTorch and its `torch.compile` variants,
  numpy or TVM untuned), the median of the interleaved rounds with the fastest and slowest round
  as the bar's whiskers; for an op suite also tunefarm's % of the CPU's fp32 or int8 peak.
- Tuning curves (`bench/curves.py`): the best latency so far against trials and against wall
  time, tunefarm and MetaSchedule on the same axes.

matplotlib is the benchmark's dependency (`pip install -e '.[bench]'`), never tunefarm's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import seeds
from .report import model_ms

COLORS = {"tunefarm": "#1f77b4", "metaschedule": "#ff7f0e", "pytorch": "#7f7f7f",
          "numpy": "#bcbd22", "tvm-untuned": "#c7c7c7"}
COMPILE_COLOR = "#2ca02c"


def _color(name: str) -> str:
    name = seeds.tuner_of(name)  # every seed of a tuner in the tuner's colour
    return COLORS.get(name, COMPILE_COLOR if name.startswith("torch.compile") else "#9467bd")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("python -m bench report needs matplotlib: pip install -e '.[bench]'"
                         ) from None
    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, timing: dict[str, dict[str, Any]], title: str) -> None:
    """Horizontal bars, ms, one per variant that ran correctly (a wrong one is labelled)."""
    names = [n for n, v in timing.items() if v.get("median_s")]
    med = [timing[n]["median_s"] * 1e3 for n in names]
    lo = [m - min(timing[n].get("rounds_s") or [m / 1e3]) * 1e3 for n, m in zip(names, med,
                                                                               strict=True)]
    hi = [max(timing[n].get("rounds_s") or [m / 1e3]) * 1e3 - m for n, m in zip(names, med,
                                                                               strict=True)]
    y = range(len(names))
    ax.barh(y, med, xerr=[lo, hi], color=[_color(n) for n in names], capsize=3)
    ax.set_yticks(list(y), [n if timing[n].get("status", "ok") == "ok" else f"{n} (WRONG)"
                            for n in names], fontsize=8)
    ax.invert_yaxis()
    for i, (m, up) in enumerate(zip(med, hi, strict=True)):  # past the whisker, not on it
        ax.text(m + up, i, f"  {m:.3g}", va="center", fontsize=7)
    ax.set_xlim(0, max(m + up for m, up in zip(med, hi, strict=True)) * 1.12 if med else 1)
    ax.set_xlabel("ms (median of the rounds; whiskers: fastest and slowest round)")
    ax.set_title(title, fontsize=9)


def _curves(axes: Any, runs: dict[str, list[list[Any]]], title: str, unit_ms: bool = True
            ) -> bool:
    """Best latency so far against trials (axes[0]) and wall time (axes[1]); False if no run
    has a point."""
    drawn = False
    for name, points in runs.items():
        pts = [p for p in points if p[2] is not None and math.isfinite(p[2])]
        if not pts:
            continue
        drawn = True
        scale = 1e3 if unit_ms else 1.0
        for ax, x in zip(axes, (0, 1), strict=True):
            # a curve of few distinct points stays visible: MetaSchedule takes in every task's
            # results after its last build, so all its estimates sit at its final trial count
            mark = "o" if len({p[x] for p in pts}) < 20 else None
            ax.step([p[x] for p in pts], [p[2] * scale for p in pts], where="post", label=name,
                    color=_color(name), marker=mark, markersize=4)
    for ax, xl in zip(axes, ("trials", "tuning wall time, s"), strict=True):
        ax.set_xlabel(xl)
        ax.set_ylabel("best so far, ms (log scale)")
        ax.set_yscale("log")  # a first random candidate may be 100× the last best
        from matplotlib.ticker import FuncFormatter

        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    return drawn


def _models(doc: dict[str, Any], plots: Path, plt: Any) -> list[str]:
    lines = ["## Models", ""]
    for name, r in doc.items():
        t = r["timing"]
        compiled = {k: v["median_s"] for k, v in t.items()
                    if k.startswith("torch.compile") and v.get("median_s")}
        best_c = min(compiled, key=lambda k: compiled[k]) if compiled else None
        tf, ms = seeds.median_s(r, "tunefarm"), seeds.median_s(r, "metaschedule")
        lines += [f"### {name} ({r['scale']}, {r['tasks']} tasks, {r['trials_per_task']} trials "
                  "per task)", ""]
        # relax's default loops (hundreds of times slower) would flatten every other bar
        shown = {k: v for k, v in t.items() if k != "tvm-untuned"}
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(shown) + 1.2))
        _bars(ax, shown, f"{name}: latency of the whole model")
        fig.tight_layout()
        fig.savefig(plots / f"model-{name}.png", dpi=110)
        plt.close(fig)
        lines.append(f"![{name} latency](plots/model-{name}.png)")
        rows = [("tunefarm" + seeds.spread(r, "tunefarm"), tf),
                ("MetaSchedule" + seeds.spread(r, "metaschedule"), ms),
                (f"best torch.compile ({best_c})" if best_c else "torch.compile",
                 compiled.get(best_c) if best_c else None),
                ("PyTorch eager", t.get("pytorch", {}).get("median_s")),
                ("TVM untuned (not in the plot)", t.get("tvm-untuned", {}).get("median_s"))]
        lines += ["", "| variant | median | tunefarm / it |", "|---|---:|---:|"]
        lines += [f"| {label} | {model_ms(v)} | {tf / v:.2f} |" if tf and v else
                  f"| {label} | {model_ms(v)} | - |" for label, v in rows]
        tuned = seeds.tuned(r)
        lines += ["", "Trials measured: " + ", ".join(
            f"{k} {v.get('trials', '-')} in {v.get('tuning_s', 0):.0f} s"
            for k, v in tuned.items() if v), ""]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
        if _curves(axes, {k: v.get("curve") or [] for k, v in tuned.items()},
                   f"{name}: estimated model latency (Σ weight × task best)"):
            fig.tight_layout()
            fig.savefig(plots / f"curve-{name}.png", dpi=110)
            lines += [f"![{name} tuning curves](plots/curve-{name}.png)", "",
                      "A tuner's curve starts once every task has a valid candidate (a sum over "
                      "some of the tasks is no estimate of the model); MetaSchedule's points "
                      "are when its task scheduler took each batch's results in."]
        else:
            lines.append("No tuning curve recorded (a run before bench/curves.py).")
        plt.close(fig)
        lines.append("")
    return lines


def _suite(doc: dict[str, Any], plots: Path, plt: Any) -> list[str]:
    rows = doc["workloads"]
    lines = ["## Op suite", "", f"{len(rows)} workloads, {doc['config'].get('trials')} trials "
             "per tuner.", ""]
    ok = [w for w in rows if "error" not in w]
    if ok:
        names = [w["id"] for w in ok]
        variants = [v for v in ("tunefarm", "metaschedule", "pytorch", "numpy")
                    if any(w["variants"].get(v, {}).get("median_s") for w in ok)]
        fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(ok)), 7))
        width = 0.8 / max(1, len(variants))
        for i, v in enumerate(variants):
            ys = [w["variants"].get(v, {}).get("median_s") or math.nan for w in ok]
            axes[0].bar([j + i * width for j in range(len(ok))], [y * 1e3 for y in ys], width,
                        label=v, color=_color(v))
        axes[0].set_yscale("log")
        axes[0].set_ylabel("ms (median, log scale)")
        axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(ok))], names, fontsize=7)
        axes[0].legend(fontsize=7)
        axes[0].set_title("latency per workload", fontsize=9)
        pct = [w.get("pct_of_peak") or 0.0 for w in ok]
        axes[1].bar(range(len(ok)), pct, color=_color("tunefarm"))
        axes[1].set_xticks(range(len(ok)), names, fontsize=7)
        axes[1].set_ylabel("% of the CPU's peak")
        axes[1].set_title("tunefarm's kernel against the peak of its dtype (bench/peak.c)",
                          fontsize=9)
        fig.tight_layout()
        fig.savefig(plots / "suite.png", dpi=110)
        plt.close(fig)
        lines += ["![latency and % of peak](plots/suite.png)", ""]
    for w in ok:
        tuning = w.get("tuning", {})
        runs = {k: v.get("curve") or [] for k, v in tuning.items() if isinstance(v, dict)}
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
        if _curves(axes, runs, f"{w['id']} {w.get('title', '')}"):
            fig.tight_layout()
            fig.savefig(plots / f"curve-{w['id']}.png", dpi=110)
            lines += [f"![{w['id']} tuning curves](plots/curve-{w['id']}.png)", ""]
        plt.close(fig)
    return lines


def render(out: Path) -> Path:
    """Write `out/report.md` and `out/plots/*.png` from the run(s) in `out`; SystemExit when
    `out` holds neither results.json nor models.json."""
    suite, models = out / "results.json", out / "models.json"
    if not suite.is_file() and not models.is_file():
        raise SystemExit(f"python -m bench report: no results.json or models.json in {out}")
    plt = _pyplot()
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    lines = ["# Benchmark report", ""]
    machine = out / "machine.json"
    for path in (suite, machine):
        if path.is_file():
            m = json.loads(path.read_text())
            m = m.get("machine", m)
            cpu = m.get("cpu", {})
            lines += [f"Machine: {cpu.get('model', '?')}, {cpu.get('logical_cpus', '?')} logical "
                      f"CPUs ({', '.join(cpu.get('isa', []))}); {m.get('threads', '?')} threads; "
                      f"commit {m.get('tunefarm_git', '?')}; {m.get('date', '')}.", ""]
            break
    if models.is_file():
        lines += _models(json.loads(models.read_text()), plots, plt)
    if suite.is_file():
        lines += _suite(json.loads(suite.read_text()), plots, plt)
    page = out / "report.md"
    page.write_text("\n".join(lines) + "\n")
    return page


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench report", description=(
        "Render DIR/report.md and DIR/plots/*.png from the results.json and models.json a run "
        "wrote into DIR."))
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="the run's output directory (default: the benchmark's, bench/results)")
    page = render(Path(p.parse_args(argv).out))
    print(f"wrote {page}")
    return 0
