"""Racing limits replayed on recorded samples: `python -m bench.racing DIR [--limits P,C ...]`.

A candidate races the job's best (`tuner.measure.evaluate.race`): past `TUNEFARM_PRUNE_FACTOR` times
the best after its first repeat, or `TUNEFARM_CONFIRM_FACTOR` after its second, it is timed no
more. Whether a pair of limits saves time without losing a job's best kernel is a question about
samples, not about the machine of the day: tune with both limits off, so that every candidate
gets all its repeats,

    TUNEFARM_PRUNE_FACTOR=0 TUNEFARM_CONFIRM_FACTOR=0 \\
        python -m bench --suite fused --only F1,F11,F22 --skip-ms --no-torch --out DIR

then replay each job's candidates in their order under each pair: how many repeats the race
takes, which candidate ends as the job's best (against the best with every repeat timed), and
how many a limit cut short while their median (of all repeats) was within 1% of the best of
their time (a near miss; below it, they would have been the new best).

`--halves` asks how long the first repeat (the screen the first limit reads) needs to be. Tune
with every candidate timed as ten repeats of half the usual length,

    TUNEFARM_REPEATS=10 TUNEFARM_MIN_REPEAT_MS=20 TUNEFARM_PRUNE_FACTOR=0 \
        TUNEFARM_CONFIRM_FACTOR=0 python -m bench --suite fused --only ... --out DIR

then replay each candidate as five full repeats (two halves each), and as a half first repeat
followed by four full ones: the timing each takes (in full repeats), near misses, and how much
slower the candidate each picks is than the job's best by the mean of all ten halves.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import TypedDict

from tuner.measure.evaluate import prune_limits, race


def load_jobs(out: Path) -> dict[str, list[tuple[float, ...]]]:
    """{workload id: its valid candidates' samples, in the order they were measured}."""
    jobs = {}
    for db in sorted(out.glob("*/tunefarm.db")):
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT latencies_json FROM records WHERE invalidity = 'ok' "
                                "ORDER BY id").fetchall()
        jobs[db.parent.name] = [tuple(json.loads(r[0])) for r in rows]
    return jobs


class Replayed(TypedDict):
    repeats: int  # taken by the race, all candidates together
    best: int | None  # the index of the job's best candidate
    near_misses: int


def replay(samples: list[tuple[float, ...]], prune: float, confirm: float,
           repeats: int) -> Replayed:
    """One job's recorded candidates raced under (prune, confirm)."""
    best: float | None = None
    best_at: int | None = None
    taken_total = near = 0
    for i, full in enumerate(samples):
        opts = SimpleNamespace(repeats=repeats, verify_below_s=best, prune_factor=prune,
                               confirm_factor=confirm)
        left = iter(full)

        def timed(n: int, short: bool = False, left: Iterator[float] = left
                  ) -> tuple[float, ...]:
            return tuple(islice(left, n))

        limits = prune_limits(opts)
        taken = race(timed, opts)
        taken_total += len(taken)
        k = len(taken)
        cut = k <= len(limits) and k < repeats and min(taken) > (limits[k - 1] or float("inf"))
        if best is not None and cut and statistics.median(full) < 1.01 * best:
            near += 1
        median = statistics.median(taken)
        if best is None or median < best:
            best, best_at = median, i
    return {"repeats": taken_total, "best": best_at, "near_misses": near}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a bench output directory (tuned with both limits 0)")
    p.add_argument("--limits", nargs="+", default=["1.5,1.1", "1.2,1.05", "1.1,1.03"],
                   help="prune,confirm pairs to replay")
    p.add_argument("--repeats", type=int, default=5, help="repeats per candidate (5)")
    p.add_argument("--halves", action="store_true",
                   help="candidates timed as 2 x repeats halves: compare screen lengths")
    args = p.parse_args()
    jobs = load_jobs(args.out)
    if args.halves:
        return halves(jobs, args.repeats, [tuple(map(float, x.split(","))) for x in args.limits])
    for name, samples in jobs.items():
        short = sum(len(s) < args.repeats for s in samples)
        if short:
            raise SystemExit(f"{name}: {short} candidates have fewer than {args.repeats} samples "
                             "(tune with TUNEFARM_PRUNE_FACTOR=0 TUNEFARM_CONFIRM_FACTOR=0)")
    truth = {name: replay(s, 0.0, 0.0, args.repeats) for name, s in jobs.items()}
    n = sum(len(s) for s in jobs.values())
    every = sum(t["repeats"] for t in truth.values())
    print(f"{len(jobs)} jobs, {n} valid candidates, {every} repeats with no limits")
    for pair in args.limits:
        prune, confirm = (float(x) for x in pair.split(","))
        res = {name: replay(s, prune, confirm, args.repeats) for name, s in jobs.items()}
        changed = [name for name in jobs if res[name]["best"] != truth[name]["best"]]
        per_job = ", ".join(f"{k} {r['repeats']}" for k, r in res.items())
        which = f" ({', '.join(changed)})" if changed else ""
        print(f"prune {prune:g}, confirm {confirm:g}: "
              f"{sum(r['repeats'] for r in res.values())} repeats ({per_job}); "
              f"best changed in {len(changed)} jobs{which}; "
              f"near misses {sum(r['near_misses'] for r in res.values())}")
    return 0


def _pairs(s: tuple[float, ...], start: int, n: int) -> tuple[float, ...]:
    return tuple((s[start + 2 * k] + s[start + 2 * k + 1]) / 2 for k in range(n))


def halves(jobs: dict[str, list[tuple[float, ...]]], repeats: int,
           limits: list[tuple[float, ...]]) -> int:
    """The `--halves` report: full against half first repeats, under each pair of limits."""
    short = [k for k, s in jobs.items() if any(len(x) < 2 * repeats for x in s)]
    if short:
        raise SystemExit(f"{', '.join(short)}: fewer than {2 * repeats} samples per candidate "
                         f"(tune with TUNEFARM_REPEATS={2 * repeats} and both limits 0)")
    def full(s: tuple[float, ...]) -> tuple[float, ...]:
        return _pairs(s, 0, repeats)

    views = {"full first repeat": (full, 0.0),
             "half first repeat": (lambda s: (s[0], *_pairs(s, 1, repeats - 1)), 0.5)}
    for prune, confirm in limits:
        for name, (view, saved) in views.items():
            cost = near = 0.0
            slower = []
            for samples in jobs.values():
                truth = [statistics.fmean(x) for x in samples]
                # a job's first candidate has no best to race: full repeats, no screen
                seen = [full(samples[0]), *(view(x) for x in samples[1:])]
                r = replay(seen, prune, confirm, repeats)
                cost += r["repeats"] - saved * (len(seen) - 1)
                near += r["near_misses"]
                if r["best"] is not None:
                    slower.append(truth[r["best"]] / min(truth))
            print(f"prune {prune:g}, confirm {confirm:g}, {name}: {cost:g} repeats, "
                  f"near misses {near:g}; the pick is slower than the best by "
                  f"{100 * (statistics.geometric_mean(slower) - 1):.2f}% on average, "
                  f"{100 * (max(slower) - 1):.1f}% at most")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
