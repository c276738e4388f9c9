"""`python -m bench --cost-model-scale [--records 10000,100000,1000000] [--pg URL]`: what the
farm's cost model costs a job as the target's history grows, on PostgreSQL with synthetic
records (random features, latencies from a fixed function of them), in a database of its own
(`tunefarm_bench_scale`, dropped first). At each size:

- full refit: the first version of the target's model (the newest `max_rows` records);
- load: `farm_model.load` (one row, the booster);
- job start: `trained_cost_model` for a workload with 64 records of its own (what a job does
  before its first batch, the MetaSchedule tune context aside);
- per batch: the job's model after a batch of 16 (`add` + `fit`), with 64 records of the
  workload and with 2048 (of which the job reads the newest `JOB_HISTORY_ROWS`);
- update: `farm_model.refresh` after 256 new records (what a tuner does after a job).

Medians of 5 runs, seconds. Writes `costmodel_scale.json` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DB_NAME = "tunefarm_bench_scale"
WORKLOADS = 2000
TARGET = '{"keys":["cpu"],"kind":"llvm","mcpu":"znver4","num-cores":2}'


def _median(f: Callable[[], Any], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fresh_db(server: str) -> str:
    import psycopg

    with psycopg.connect(server, autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
        con.execute(f"CREATE DATABASE {DB_NAME}")
    base = server.rsplit("/", 1)[0]
    return f"{base}/{DB_NAME}"


def _copy_records(url: str, target_id: int, wids: list[int], start: int, n: int,
                  rng: np.random.Generator) -> None:
    """n synthetic records, spread over `wids`, through COPY."""
    import psycopg

    from tuner.search.costmodel import FEATURE_DIM

    w = np.zeros(FEATURE_DIM, dtype=np.float32)
    w[[3, 50, 170]] = [1.5, -1.0, 0.8]
    cols = ("trial_id, workload_id, target_id, space, cand_hash, trace_json, decisions_json, "
            "latencies_json, median_s, mean_s, invalidity, features, tvm_version, created_at, "
            "measured_at")
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as con, \
            con.cursor() as cur, cur.copy(f"COPY records ({cols}) FROM STDIN") as copy:
        for lo in range(0, n, 10_000):
            k = min(10_000, n - lo)
            x = rng.normal(size=(k, FEATURE_DIM)).astype(np.float32)
            owner = rng.integers(0, len(wids), size=k)
            lat = 1e-4 * (1 + owner % 7) / (1.0 + np.exp(x @ w))
            for i in range(k):
                t = start + lo + i
                copy.write_row((f"s{t}", wids[owner[i]], target_id, "s", f"{t:032x}", "[]", "[]",
                                f"[{lat[i]}]", float(lat[i]), float(lat[i]), "ok",
                                x[i].tobytes(), "bench", "2026-01-01T00:00:00Z",
                                "2026-01-01T00:00:00Z"))


def run_scale(args: argparse.Namespace) -> int:
    from sqlalchemy import text

    from tuner.db import Store
    from tuner.db import cost_models as cm
    from tuner.search import farm_model
    from tuner.search.costmodel import FEATURE_DIM
    from tuner.search.history import trained_cost_model

    url = _fresh_db(args.pg)
    store = Store(url)
    tref = store.ensure_target(TARGET, "bench")
    wids = [store.ensure_workload(key=f"w{i}", op="tir", spec_json="{}", shash=str(i),
                                  mod_json="", description="", flops=1) for i in range(WORKLOADS)]
    probe = store.ensure_workload(key="probe", op="tir", spec_json="{}", shash="p", mod_json="",
                                  description="", flops=1)
    rng = np.random.default_rng(0)
    _copy_records(url, tref.id, [probe], 0, 64, rng)
    big = store.ensure_workload(key="big", op="tir", spec_json="{}", shash="b", mod_json="",
                                description="", flops=1)
    _copy_records(url, tref.id, [big], 64, 2048, rng)  # capped at JOB_HISTORY_ROWS
    have, sizes, results = 2112, [int(s) for s in args.records.split(",")], []
    for n in sizes:
        print(f"{n} records: inserting", flush=True)
        _copy_records(url, tref.id, wids, have, n - have, rng)
        have = n
        with store.session() as s:
            s.execute(text("ANALYZE records"))
            s.execute(text("DELETE FROM cost_models"))
        t0 = time.perf_counter()
        farm_model.refresh(store, tref, full=True)
        full_s = time.perf_counter() - t0
        load_s = _median(lambda: farm_model.load(store, tref))
        start_s = _median(lambda: trained_cost_model(store, tref, probe, 0))
        batch = rng.normal(size=(16, FEATURE_DIM)).astype(np.float32)

        def one_batch(wid: int, batch: np.ndarray = batch) -> Callable[[], None]:
            model = trained_cost_model(store, tref, wid, 0)

            def step() -> None:
                model.add(batch, [1e-4] * 16, group=wid)
                model.fit()
            return step

        batch_64 = _median(one_batch(probe))
        batch_2048 = _median(one_batch(big))
        _copy_records(url, tref.id, wids, have, 256, rng)
        have += 256
        t0 = time.perf_counter()
        farm_model.refresh(store, tref)
        update_s = time.perf_counter() - t0
        rows = cm.latest(store, tref.id)
        row = {"records": n, "full_refit_s": full_s, "load_s": load_s, "job_start_s": start_s,
               "batch_s_64": batch_64, "batch_s_big": batch_2048, "update_s": update_s,
               "model_rows": rows.rows if rows else 0,
               "booster_bytes": len(rows.booster) if rows else 0, "feature_dim": FEATURE_DIM}
        results.append(row)
        print(json.dumps(row), flush=True)
    store.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costmodel_scale.json").write_text(json.dumps(results, indent=1))
    print("| records | full refit | load | job start | batch (64) | batch (256+) | update |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['records']:,} | {r['full_refit_s']:.2f} s | {r['load_s']:.3f} s | "
              f"{r['job_start_s']:.3f} s | {r['batch_s_64']:.3f} s | {r['batch_s_big']:.3f} s | "
              f"{r['update_s']:.2f} s |")
    return 0
