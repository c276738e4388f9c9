"""`python -m bench --transfer`: does the farm's cost model of a target help a workload it never
saw? Leave-one-out over suites (default: public + fused), on this machine:

1. Cold: every workload tuned once (`--trials`, 64) in one SQLite database with
   TUNEFARM_COST_MODEL_TRANSFER off (each job learns from its own records only).
2. Ranking, per objective (regression, pairwise, ndcg): for each workload, a model refitted on
   every other workload's cold records scores the workload's own cold records (held out): mean
   Kendall τ within the workload, and whether the measured best is its top-1 / in its top-5.
3. Warm: for each workload, a copy of the cold database without that workload's records, the
   farm's model refitted on the rest (`--objective`; auto: the objective that ranked best in
   2), then the workload tuned again with transfer on. Trials to reach 95% of the cold run's
   best throughput (latency <= best / 0.95), warm and cold; a run that never reaches it counts
   as 2 × trials in the geometric mean.

Writes `transfer.json` and `transfer.md` under `--out`/transfer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np

from .suites import load_suite, select


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _transfer(on: bool) -> None:
    from tuner.config import get_settings

    os.environ["TUNEFARM_COST_MODEL_TRANSFER"] = "1" if on else "0"
    get_settings.cache_clear()


def _tune(db: Path, wl: Any, target: dict[str, Any], trials: int, seed: int) -> str:
    """Tune `wl` in `db`; the job id."""
    from dataclasses import replace

    from tuner.config import get_settings
    from tuner.db import Store
    from tuner.measure import MeasureOptions
    from tuner.search import Tuner, TuneRequest
    from workers.local import LocalMeasurer

    s = get_settings()
    opts = replace(MeasureOptions.from_settings(s, target), num_threads=target["num-cores"])
    store = Store(f"sqlite:///{db}")
    try:
        with LocalMeasurer() as measurer:
            summary = Tuner(store, measurer).run(TuneRequest(
                workload=wl, target=target, trials=trials, batch_size=s.batch_size, seed=seed,
                fresh=True, options=opts))
    finally:
        store.close()
    return summary.job_id


def _curve(db: Path, job_id: str) -> list[float]:
    """Best latency so far after each trial of a job (inf before the first valid one)."""
    from tuner.db import Store

    store = Store(f"sqlite:///{db}")
    try:
        rows = [r for r in store.records(job_id=job_id, order="id")
                if r.invalidity.value != "worker_lost"]
    finally:
        store.close()
    best, out = math.inf, []
    for r in rows:
        if r.ok and r.median_s:
            best = min(best, r.median_s)
        out.append(best)
    return out


def trials_to(curve: list[float], goal_s: float, cap: int) -> int:
    """First trial (1-based) whose best-so-far latency is <= goal_s; 2 × cap if none."""
    return next((i + 1 for i, b in enumerate(curve) if b <= goal_s), 2 * cap)


def _without(cold: Path, dst: Path, workload_id: int) -> None:
    """A copy of the cold database without one workload's records and jobs, nor any model."""
    shutil.copy(cold, dst)
    con = sqlite3.connect(dst)
    with con:
        jobs = [r[0] for r in con.execute("SELECT id FROM jobs WHERE workload_id = ?",
                                          (workload_id,))]
        con.execute("DELETE FROM records WHERE workload_id = ?", (workload_id,))
        con.executemany("DELETE FROM jobs WHERE id = ?", [(j,) for j in jobs])
        con.execute("DELETE FROM cost_models")
    con.close()


def _ranking(cold: Path, jobs: dict[str, tuple[int, str]], objective: str) -> dict[str, Any]:
    """Leave-one-out ranking of each workload's cold records by a model of the others."""
    import xgboost as xgb

    from tuner.db import Store
    from tuner.db import cost_models as cm
    from tuner.search import farm_model
    from tuner.search.costmodel import FEATURE_DIM

    store = Store(f"sqlite:///{cold}")
    cfg = farm_model.FarmModelConfig(objective=objective)
    per: dict[str, Any] = {}
    try:
        tref = store.get_target(store.get_job(next(iter(jobs.values()))[1]).target_id)  # type: ignore[union-attr]
        assert tref is not None
        rows = cm.newest_rows(store, tref.id, 1_000_000, dim=FEATURE_DIM)
        y = farm_model.labels(store, tref, rows)
        for wid_name, (wid, _job) in jobs.items():
            mine = rows.workload_ids == wid
            rest = cm.TrainingRows(rows.ids[~mine], rows.workload_ids[~mine],
                                   rows.features[~mine], rows.median_s[~mine])
            booster = farm_model.train(rest, y[~mine], cfg)
            scores = np.asarray(booster.predict(xgb.DMatrix(rows.features[mine])))
            per[wid_name] = farm_model.ranking_metrics(scores, y[mine],
                                                       rows.workload_ids[mine])
    finally:
        store.close()
    done = [m for m in per.values() if m]
    return {"objective": objective, "per_workload": per,
            **{k: float(np.mean([m[k] for m in done])) for k in ("kendall_tau", "top1", "top5")}}


def run_transfer(args: argparse.Namespace) -> int:
    from tuner import tvm_api as tv
    from tuner.db import Store
    from tuner.search import farm_model
    from tuner.workloads import parse_spec

    out = Path(args.out) / "transfer"
    out.mkdir(parents=True, exist_ok=True)
    entries = select([e for name in args.suite.split(",") for e in load_suite(name)], args.only)
    target = (tv.host_target_dict(num_cores=args.threads) if args.target == "host"
              else json.loads(args.target))
    cold = out / "cold.db"
    state_path = out / "cold.json"
    state: dict[str, Any] = json.loads(state_path.read_text()) if (
        args.reuse_tuning and state_path.exists()) else {}
    if not state:
        for p in out.glob("cold.db*"):
            p.unlink()
    _transfer(False)
    for e in entries:
        if e["id"] in state:
            continue
        log(f"{e['id']} {e['title']}: cold, {args.trials} trials")
        t0 = time.monotonic()
        job = _tune(cold, parse_spec(e["spec"]), target, args.trials, args.seed)
        state[e["id"]] = {"job": job, "cold_s": time.monotonic() - t0}
        state_path.write_text(json.dumps(state, indent=1))
    store = Store(f"sqlite:///{cold}")
    jobs = {i: (store.get_job(v["job"]).workload_id, v["job"])  # type: ignore[union-attr]
            for i, v in state.items() if i in {e["id"] for e in entries}}
    store.close()

    ranking = [_ranking(cold, jobs, o) for o in ("regression", "pairwise", "ndcg")]
    for r in ranking:
        log(f"ranking, {r['objective']}: τ {r['kendall_tau']:.3f}, top-1 {r['top1']:.0%}, "
            f"top-5 {r['top5']:.0%}")

    if args.objective == "auto":  # the objective that ranked held-out workloads best
        args.objective = max(ranking, key=lambda r: r["kendall_tau"])["objective"]
    _transfer(True)
    results = []
    for e in entries:
        wid, job = jobs[e["id"]]
        cold_curve = _curve(cold, job)
        best = min(cold_curve)
        if not math.isfinite(best):
            log(f"{e['id']}: no valid cold record; skipped")
            continue
        loo = out / f"loo-{e['id']}.db"
        _without(cold, loo, wid)
        lstore = Store(f"sqlite:///{loo}")
        tref = lstore.ensure_target(tv.canonical_target_json(tv.make_target(target)), "local")
        model = farm_model.refresh(lstore, tref, full=True,
                                   cfg=farm_model.FarmModelConfig(objective=args.objective))
        lstore.close()
        log(f"{e['id']}: warm, model of {model.rows if model else 0} records of the others")
        t0 = time.monotonic()
        warm_job = _tune(loo, parse_spec(e["spec"]), target, args.trials, args.seed)
        warm_s = time.monotonic() - t0
        warm_curve = _curve(loo, warm_job)
        goal = best / 0.95
        row = {"id": e["id"], "title": e["title"], "cold_best_s": best,
               "warm_best_s": min(warm_curve),
               "cold_trials": trials_to(cold_curve, goal, args.trials),
               "warm_trials": trials_to(warm_curve, goal, args.trials),
               "cold_s": state[e["id"]]["cold_s"], "warm_s": warm_s}
        results.append(row)
        log(f"{e['id']}: 95% of the cold best in {row['warm_trials']} warm trials vs "
            f"{row['cold_trials']} cold")
        for p in out.glob(f"loo-{e['id']}.db*"):
            p.unlink()
    gm = {k: float(np.exp(np.mean(np.log([r[k] for r in results]))))
          for k in ("cold_trials", "warm_trials")} if results else {}
    report = {"trials": args.trials, "objective": args.objective, "target": target,
              "ranking": ranking, "workloads": results, "geomean": gm}
    (out / "transfer.json").write_text(json.dumps(report, indent=1))
    (out / "transfer.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = ["| objective | Kendall τ | top-1 | top-5 |", "|---|---|---|---|"]
    for r in report["ranking"]:
        lines.append(f"| {r['objective']} | {r['kendall_tau']:.3f} | {r['top1']:.0%} | "
                     f"{r['top5']:.0%} |")
    lines += ["", f"Trials to 95% of the cold {report['trials']}-trial best "
                  f"(objective {report['objective']}; never reached: 2 × trials):", "",
              "| id | workload | cold | warm | cold best | warm best |",
              "|---|---|---|---|---|---|"]
    for r in report["workloads"]:
        lines.append(f"| {r['id']} | {r['title']} | {r['cold_trials']} | {r['warm_trials']} | "
                     f"{r['cold_best_s'] * 1e6:.1f} µs | {r['warm_best_s'] * 1e6:.1f} µs |")
    gm = report["geomean"]
    if gm:
        lines.append(f"| | geometric mean | {gm['cold_trials']:.1f} | {gm['warm_trials']:.1f} "
                     "| | |")
    return "\n".join(lines) + "\n"
