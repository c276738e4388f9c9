"""`python -m bench.search`: compare search changes on recorded measurements, in seconds.

The search loop (`Tuner.run`) runs against a `ReplayMeasurer` that answers every candidate from
the records of an earlier run (any database: the CLI's SQLite file, the service's PostgreSQL):
no build, no timing. Each seed runs in a fresh throw-away SQLite database, so dedup and the
cost model see only that run. A candidate the recording lacks is measured for real on this
machine (`--fallback measure`, the default: slower, and only comparable on the same machine) or
stops the run (`--fallback none`: the report says how far it got).

    tunefarm tune matmul --shape 512,512,512 --trials 256          # the recording
    python -m bench.search --workload '{"op": "matmul", "shape": [512, 512, 512]}' \\
        --trials 64 --seeds 0,1,2                                   # the search, replayed

For each seed: trials run, how many came from the recording, the best latency found, the trial
at which the search first came within 5% of the recording's best (the figure to compare between
search versions), and the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class SeedRun:
    seed: int
    trials: int
    replayed: int
    measured: int
    best_s: float | None
    within_5pct_at: int | None  # trial at which the best came within 5% of the recording's
    wall_s: float
    stop: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="the workload spec as JSON")
    p.add_argument("--db", help="database holding the recording (default: tunefarm's)")
    p.add_argument("--target", default="host", help='"host" or a JSON target dict')
    p.add_argument("--device-key", default="local")
    p.add_argument("--space", default="default")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--seeds", default="0", help="comma-separated seeds (0)")
    p.add_argument("--fallback", choices=("measure", "none"), default="measure",
                   help="a candidate the recording lacks: measure it here, or stop the run")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error("--trials must be >= 1")
    return args


def recording(db_url: str, wl: Any, target: dict[str, Any], device_key: str) -> Any:
    """The ReplayMeasurer of every record of `wl` on `target` in `db_url` (without a fallback)."""
    from tuner.core import tvm_api as tv
    from tuner.db import Store
    from tuner.db.engine import target_key
    from tuner.measure.replay import ReplayMeasurer

    store = Store(db_url)
    try:
        tkey = target_key(tv.canonical_target_json(tv.make_target(target)), device_key)
        return ReplayMeasurer.from_store(store, workload_key=wl.key, target_key=tkey)
    finally:
        store.close()


def run_seed(replay: Any, wl: Any, target: dict[str, Any], args: argparse.Namespace, seed: int,
             real: Any | None, best_recorded: float | None) -> SeedRun:
    from tuner.core.config import get_settings
    from tuner.core.errors import TunefarmError
    from tuner.db import Store
    from tuner.measure import MeasureOptions
    from tuner.search import Progress, Tuner, TuneRequest

    replay.fallback = real.measure_one if real is not None else None
    replay.replayed = replay.fell_back = 0
    replay.answered.clear()
    s = get_settings()
    req = TuneRequest(workload=wl, target=target, trials=args.trials, space=args.space,
                      device_key=args.device_key, batch_size=s.batch_size, seed=seed,
                      fresh=True, options=MeasureOptions.from_settings(s, target))
    first_close: list[int] = []

    def progress(p: Progress) -> None:
        if (not first_close and best_recorded and p.best_s is not None
                and p.best_s <= best_recorded * 1.05):
            first_close.append(p.done)

    with tempfile.TemporaryDirectory(prefix="tunefarm-bench-search-") as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'search.db'}")
        t0 = time.monotonic()
        try:
            summary = Tuner(store, replay, on_progress=progress).run(req)
            trials, best_s, stop = summary.trials_done, summary.best_s, summary.stop_reason
        except TunefarmError as exc:  # e.g. NotRecorded with --fallback none
            ok = [r.median_s for r in replay.answered.values() if r.ok and r.median_s]
            trials, best_s, stop = len(replay.answered), min(ok, default=None), str(exc)
        finally:
            store.close()
    return SeedRun(seed, trials, replay.replayed, replay.fell_back, best_s,
                   first_close[0] if first_close else None, time.monotonic() - t0, stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tuner.core import tvm_api as tv
    from tuner.core.config import get_settings
    from tuner.workloads import parse_spec

    wl = parse_spec(json.loads(args.workload))
    target = tv.target_to_dict(tv.make_target(args.target))
    replay = recording(args.db or get_settings().resolved_database_url(), wl, target,
                       args.device_key)
    if not replay.recording:
        print(f"no records of {wl.key} on {json.dumps(target)} ({args.device_key}) to replay",
              file=sys.stderr)
        return 2
    lats = [r.median_s for r in replay.recording.values() if r.ok and r.median_s]
    best_recorded = min(lats) if lats else None
    print(f"recording: {len(replay.recording)} candidates, best "
          f"{best_recorded * 1e3:.4g} ms" if best_recorded else "recording: no valid candidate")
    real = None
    if args.fallback == "measure":
        from tuner.measure.local import LocalMeasurer

        real = LocalMeasurer()
    try:
        runs = [run_seed(replay, wl, target, args, int(seed), real, best_recorded)
                for seed in args.seeds.split(",")]
    finally:
        if real is not None:
            real.close()
    print("| seed | trials | replayed | measured | best ms | within 5% at | wall s | stop |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in runs:
        best = f"{r.best_s * 1e3:.4g}" if r.best_s else "-"
        print(f"| {r.seed} | {r.trials} | {r.replayed} | {r.measured} | {best} | "
              f"{r.within_5pct_at or '-'} | {r.wall_s:.1f} | {r.stop} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
