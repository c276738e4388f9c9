"""Smoke test of the benchmark harness: a one-workload suite (matmul 64³), 2 trials per tuner,
1 round, without PyTorch. Runs `python -m bench` as a child (it sets the thread variables before
TVM loads) and checks that results.json has every column and that every output was checked."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the suite file, the output directory) of one run of a one-workload suite."""
    tmp = tmp_path_factory.mktemp("bench")
    suite = tmp / "suite.json"
    suite.write_text(json.dumps([{"id": "S1", "title": "matmul 64³", "peak": "fp32",
                                  "spec": {"op": "matmul", "shape": [64, 64, 64]}}]))
    out = tmp / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--suite", str(suite), "--trials", "2", "--rounds", "1",
         "--min-ms", "2", "--no-torch", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return suite, out


def test_bench_runs_a_tiny_suite_and_reports_every_column(tiny_run: tuple[Path, Path]) -> None:
    suite, out = tiny_run

    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["trials"] == 2 and doc["config"]["rounds"] == 1
    m = doc["machine"]
    assert m["threads"] == 2 and m["env"]["TVM_NUM_THREADS"] == "2"
    assert m["versions"]["tvm"] and m["cpu"]["logical_cpus"]
    (w,) = doc["workloads"]
    assert w["id"] == "S1" and w["flops"] == 2 * 64**3 and "error" not in w

    v = w["variants"]
    assert set(v) == {"tunefarm", "metaschedule", "pytorch", "numpy", "tunefarm-pyloop"}
    assert v["pytorch"]["status"] == "unavailable"
    for name in ("tunefarm", "metaschedule", "numpy", "tunefarm-pyloop"):
        r = v[name]
        assert r["status"] == "ok" and r["correct"], (name, r)
        assert r["checked"] == 2 and all(c["ok"] for c in r["checks"])  # first call + after timing
        assert len(r["rounds_s"]) == 1 and r["median_s"] > 0 and r["gflops"] > 0
        assert r["calls_per_round"][0] >= 1
    for name in ("tunefarm", "metaschedule"):
        assert v[name]["same_params_as_tuned_kernel"] is True
        t = w["tuning"][name]
        assert t["wall_s"] > 0 and t["trials_done"] == 2 and t["valid"] >= 1
        # the tuning curve: one point per trial, best so far never rising, within the tuning
        curve = t["curve"]
        trials = [p[0] for p in curve]  # a point per batch measured
        assert trials[-1] == 2 and trials == sorted(set(trials)), (name, curve)
        lats = [p[2] for p in curve if p[2] is not None]
        assert lats and lats == sorted(lats, reverse=True), (name, curve)
        assert all(0 <= p[1] <= t["wall_s"] for p in curve), (name, curve)

    # every table column has its value in the JSON
    assert doc["columns"][0] == "workload" and len(doc["columns"]) == 12
    # tunefarm's kernel from a Python loop, as PyTorch is: the difference is the dispatch
    assert w["dispatch_s"] == pytest.approx(
        v["tunefarm-pyloop"]["median_s"] - v["tunefarm"]["median_s"])
    assert w["ratios"]["tunefarm/pytorch, same loop"] is None  # no PyTorch in this run
    assert w["pct_of_peak"] == pytest.approx(100 * v["tunefarm"]["gflops"] / 529.0)
    assert w["pct_of_peak_best_round"] == pytest.approx(
        100 * w["flops"] / min(v["tunefarm"]["rounds_s"]) / 1e9 / 529.0)
    assert w["ratios"]["tunefarm/metaschedule"] == pytest.approx(
        v["tunefarm"]["median_s"] / v["metaschedule"]["median_s"])
    assert "tunefarm/pytorch" in w["ratios"] and w["ratios"]["tunefarm/pytorch"] is None
    s = doc["summary"]
    assert s["n_tunefarm_over_metaschedule"] == 1 and s["wrong_outputs"] == []
    assert s["geomean_tunefarm_over_metaschedule"] == pytest.approx(
        w["ratios"]["tunefarm/metaschedule"])

    md = (out / "results.md").read_text()
    assert "| " + " | ".join(doc["columns"]) + " |" in md
    assert "| S1 matmul 64³ |" in md and "Geometric mean of tunefarm/MS" in md

    # the two picks saved there, timed again over placements of their arguments
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--suite", str(suite), "--trials", "2", "--min-ms", "2",
         "--placements", "3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (p,) = json.loads((out / "placements.json").read_text())["workloads"]
    assert p["id"] == "S1" and len(p["offsets"]) == 3
    assert all(0 <= off < 4096 and off % 64 == 0 for where in p["offsets"] for off in where)
    for name in ("tunefarm", "metaschedule"):
        assert len(p["times_s"][name]) == 3 and all(t > 0 for t in p["times_s"][name])
    assert p["tunefarm/metaschedule"] == pytest.approx(
        p["median_s"]["tunefarm"] / p["median_s"]["metaschedule"])
    assert "| S1 matmul 64³ |" in (out / "placements.md").read_text()

    # a budget nothing was saved for: a clear error, not a traceback
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--suite", str(suite), "--trials", "3", "--min-ms", "2",
         "--placements", "3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0 and "no saved tunefarm pick" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_the_transfer_benchmark_runs_leave_one_out_and_judges_side_by_side(
        tmp_path: Path) -> None:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps([
        {"id": "S1", "title": "matmul 64³", "peak": "fp32",
         "spec": {"op": "matmul", "shape": [64, 64, 64]}},
        {"id": "S2", "title": "matmul 96×64×128", "peak": "fp32",
         "spec": {"op": "matmul", "shape": [96, 64, 128]}}]))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--transfer", "--suite", str(suite), "--trials", "4",
         "--objective", "regression", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    doc = json.loads((out / "transfer" / "transfer.json").read_text())
    assert [w["id"] for w in doc["workloads"]] == ["S1", "S2"]
    assert {r["objective"] for r in doc["ranking"]} == {"regression", "pairwise", "ndcg"}
    for w in doc["workloads"]:
        sbs = w["sbs"]
        best = sbs["timed"][sbs["best"]]
        assert best["status"] == "ok" and best["median_s"] > 0 and len(best["rounds_s"]) == 7
        assert sbs["best"] in sbs["reaching"]  # the cold best reaches its own goal
        cold = [h for h, _ in w["cold_measured"]]
        assert 1 <= w["cold_trials_sbs"] <= cold.index(sbs["best"]) + 1
        assert 1 <= w["warm_trials_sbs"] <= 8  # 2 × trials when never
        assert len(w["warm_measured"]) == 4
    md = (out / "transfer" / "transfer.md").read_text()
    assert "| S1 | matmul 64³ |" in md and "| | geometric mean |" in md


def test_the_report_renders_the_run_on_one_page(tiny_run: tuple[Path, Path]) -> None:
    """`python -m bench report`: the latency bars, the % of peak and each workload's tuning
    curves, as PNGs the page links (matplotlib: the bench extra, which CI installs)."""
    if importlib.util.find_spec("matplotlib") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("matplotlib is missing (pip install -e '.[bench]'); CI=true requires it")
        pytest.skip("matplotlib is not installed: pip install -e '.[bench]'")
    _, out = tiny_run
    proc = subprocess.run([sys.executable, "-m", "bench", "report", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = (out / "report.md").read_text()
    assert "](plots/suite.png)" in page and "](plots/curve-S1.png)" in page, page
    for png in ("suite.png", "curve-S1.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
