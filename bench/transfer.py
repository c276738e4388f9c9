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
   best throughput, warm and cold: the first trial that measured <= best / 0.95, or (warm) that
   measured a program the cold run measured that fast. Two runs that measure the same program
   time it apart, and a memory-bound kernel's timing moves by more than 5% from one minute to
   the next on a shared machine; the table also gives the warm trials by the warm run's own
   timing alone. A run that never reaches the goal counts as 2 × trials in the geometric mean.
4. Side by side (`bench.side_by_side`): right after each warm run, the programs of both runs
   that could have reached the goal are compiled and timed again in one process, interleaved,
   beside the cold run's best; both runs are scored again on those timings (the first trial
   that measured a program within 1/0.95 of the cold best's time in the same rounds). These
   are the headline columns: the one rule for both runs, free of the drift between them.

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
    from tuner.core.config import get_settings

    os.environ["TUNEFARM_COST_MODEL_TRANSFER"] = "1" if on else "0"
    get_settings.cache_clear()


def _tune(db: Path, wl: Any, target: dict[str, Any], trials: int, seed: int) -> str:
    """Tune `wl` in `db`; the job id."""
    from dataclasses import replace

    from tuner.core.config import get_settings
    from tuner.db import Store
    from tuner.measure import MeasureOptions
    from tuner.measure.local import LocalMeasurer
    from tuner.search import Tuner, TuneRequest

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


def _trials(db: Path, job_id: str) -> list[tuple[str, float | None]]:
    """Each measured trial of a job in order: its program's hash and its latency (None when it
    failed)."""
    from tuner.db import Store

    store = Store(f"sqlite:///{db}")
    try:
        rows = [r for r in store.records(job_id=job_id, order="id")
                if r.invalidity.value != "worker_lost"]
    finally:
        store.close()
    return [(r.cand_hash, r.median_s if r.ok and r.median_s else None) for r in rows]


def _traces(db: Path, job_id: str, hashes: set[str]) -> dict[str, str]:
    """The trace of each program of `hashes` that the job measured."""
    from tuner.db import Store

    store = Store(f"sqlite:///{db}")
    try:
        return {r.cand_hash: r.trace_json for r in store.records(job_id=job_id)
                if r.cand_hash in hashes}
    finally:
        store.close()


def _judge(wl: Any, target: dict[str, Any], cold: tuple[Path, str, list[tuple[str, float | None]]],
           warm: tuple[Path, str, list[tuple[str, float | None]]], goal: float, cap: int
           ) -> dict[str, Any]:
    """Both runs' trials to the goal, judged side by side (`bench.side_by_side`)."""
    from . import side_by_side as sbs

    (cold_db, cold_job, cold_trials), (warm_db, warm_job, warm_trials) = cold, warm
    best = min((lat, h) for h, lat in cold_trials if lat is not None)[1]
    cold_short = sbs.shortlist(cold_trials, goal)
    warm_short = sbs.shortlist(warm_trials, goal)
    traces = _traces(warm_db, warm_job, set(warm_short))
    traces |= _traces(cold_db, cold_job, set(cold_short) | {best})  # the same program: either
    log(f"  side by side: {len(traces)} programs")
    timed = sbs.retime(wl, traces, target, rounds=sbs.ROUNDS, min_ms=sbs.MIN_MS,
                       pause_s=sbs.PAUSE_S, log=log)
    reach = sbs.reaching({h: t["median_s"] for h, t in timed.items()}, best)
    return {"cold_trials_sbs": trials_to(cold_trials, 0.0, cap, reach),
            "warm_trials_sbs": trials_to(warm_trials, 0.0, cap, reach),
            "sbs": {"best": best, "reaching": sorted(reach), "timed": timed}}


def trials_to(trials: list[tuple[str, float | None]], goal_s: float, cap: int,
              fast: frozenset[str] = frozenset()) -> int:
    """First valid trial (1-based) that measured <= goal_s, or that measured a program of
    `fast` (one another run measured <= goal_s: the same program, whatever this run's timing
    noise said of it); 2 × cap if none."""
    return next((i + 1 for i, (h, lat) in enumerate(trials)
                 if lat is not None and (lat <= goal_s or h in fast)), 2 * cap)


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
    from tuner.core import tvm_api as tv
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
        cold_trials = _trials(cold, job)
        best = min((lat for _, lat in cold_trials if lat is not None), default=math.inf)
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
        warm_trials = _trials(loo, warm_job)
        goal = best / 0.95
        fast = frozenset(h for h, lat in cold_trials if lat is not None and lat <= goal)
        row = {"id": e["id"], "title": e["title"], "cold_best_s": best,
               "warm_best_s": min((lat for _, lat in warm_trials if lat is not None),
                                  default=math.inf),
               "cold_trials": trials_to(cold_trials, goal, args.trials),
               "warm_trials": trials_to(warm_trials, goal, args.trials, fast),
               "warm_trials_timed": trials_to(warm_trials, goal, args.trials),
               "cold_s": state[e["id"]]["cold_s"], "warm_s": warm_s,
               "cold_measured": cold_trials, "warm_measured": warm_trials}
        row |= _judge(parse_spec(e["spec"]), target, (cold, job, cold_trials),
                      (loo, warm_job, warm_trials), goal, args.trials)
        results.append(row)
        log(f"{e['id']}: 95% of the cold best in {row['warm_trials']} warm trials vs "
            f"{row['cold_trials']} cold; side by side {row['warm_trials_sbs']} vs "
            f"{row['cold_trials_sbs']}")
        for p in out.glob(f"loo-{e['id']}.db*"):
            p.unlink()
    gm = {k: float(np.exp(np.mean(np.log([r[k] for r in results]))))
          for k in ("cold_trials", "warm_trials", "warm_trials_timed", "cold_trials_sbs",
                    "warm_trials_sbs")} if results else {}
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
                  f"(objective {report['objective']}; never reached: 2 × trials). Side by side: "
                  "both runs judged on the programs timed again together; then each run's own "
                  "timing (warm: or a program the cold run timed within the goal), and the warm "
                  "run's own timing only:", "",
              "| id | workload | cold, side by side | warm, side by side | cold | warm | "
              "warm, by its own timing only | cold best | warm best |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in report["workloads"]:
        lines.append(f"| {r['id']} | {r['title']} | {r['cold_trials_sbs']} | "
                     f"{r['warm_trials_sbs']} | {r['cold_trials']} | {r['warm_trials']} | "
                     f"{r['warm_trials_timed']} | {r['cold_best_s'] * 1e6:.1f} µs | "
                     f"{r['warm_best_s'] * 1e6:.1f} µs |")
    gm = report["geomean"]
    if gm:
        lines.append(f"| | geometric mean | {gm['cold_trials_sbs']:.1f} | "
                     f"{gm['warm_trials_sbs']:.1f} | {gm['cold_trials']:.1f} | "
                     f"{gm['warm_trials']:.1f} | {gm['warm_trials_timed']:.1f} | | |")
    return "\n".join(lines) + "\n"
