"""`python -m bench --suite fused --only F24 --out DIR --placements 24`: a run's two picks
(tunefarm's and MetaSchedule's best records, saved in DIR by an earlier run with the same
--trials and target) timed over fresh placements of their arguments.

The suite times each kernel on one set of arguments, wherever the allocator put them. Some
kernels' speed depends on where their tensors start in a page against each other (on a Xeon,
likely 4K aliasing of the output's stores with the input's loads), so one placement can favour
either kernel (bench/RESULTS.md Runs AX and BB: F24's pick 12.2-15.5 µs over 16 offsets of its
output). Here every round draws one page offset (a 64-byte step) per argument, copies each
kernel's arguments there (numpy buffers shared with TVM through DLPack, so that the kernel reads
and writes exactly those addresses), times the kernels one after another on the same offsets
(the first kernel rotating), and checks every output against the reference. The verdict is the
median over the rounds. Writes placements.json and placements.md in DIR.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from .suites import load_suite, select

PAGE = 4096
STEP = 64  # a cache line: offsets within a page in these steps
NAMES = ("tunefarm", "metaschedule")


def placed(value: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `value` whose data starts `offset` bytes into a page (the array keeps its
    page-aligned backing buffer alive)."""
    raw = np.empty(value.nbytes + 2 * PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE + offset
    out = raw[start:start + value.nbytes].view(value.dtype).reshape(value.shape)
    out[...] = value
    return out


def offsets(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, PAGE, STEP) for _ in range(n)]


def _kernels(entry: dict[str, Any], wl: Any, inputs: list[np.ndarray], target: dict[str, Any],
             wdir: Path, trials: int) -> dict[str, Any]:
    from tuner.core import tvm_api as tv

    from .kernels import prepare, sched_mod_from_trace
    from .tune import load_summary

    kernels = {}
    for name in NAMES:
        summ = load_summary(wdir, name, trials=trials, target=target)
        if summ is None or not summ.get("best_trace"):
            raise SystemExit(f"{entry['id']}: no saved {name} pick in {wdir} for {trials} trials "
                             "on this target: run the suite there first")
        kernels[name] = prepare(sched_mod_from_trace(wl, summ["best_trace"]), wl, inputs,
                                tv.make_target(target))
    return kernels


def time_entry(entry: dict[str, Any], target: dict[str, Any], args: argparse.Namespace,
               rng: random.Random) -> dict[str, Any]:
    from tuner.core import tvm_api as tv
    from tuner.workloads import parse_spec

    from .timing import check

    wl = parse_spec(entry["spec"])
    inputs = wl.make_inputs(0)
    reference = wl.reference(inputs)
    rtol, atol = wl.tolerance()
    kernels = _kernels(entry, wl, inputs, target, Path(args.out) / entry["id"], args.trials)
    values = {name: [a.numpy() for a in k.args] for name, k in kernels.items()}
    for name, k in kernels.items():  # outputs start zeroed, as the references assume
        for v in values[name][-k.n_out:]:
            v[...] = 0
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    rounds = []
    for r in range(args.placements):
        where = offsets(rng, max(len(v) for v in values.values()))
        rounds.append(where)
        order = list(NAMES[r % 2:] + NAMES[:r % 2])
        for name in order:
            k = kernels[name]
            arrs = [placed(v, off) for v, off in zip(values[name], where, strict=False)]
            on = [tv.tvm.runtime.from_dlpack(a) for a in arrs]
            times[name].append(k.evaluator(1, args.min_ms, on)())
            verdict = check(arrs[-k.n_out:], reference, rtol, atol)
            if not verdict["ok"]:
                raise SystemExit(f"{entry['id']} {name}: wrong output at offsets {where}: "
                                 f"{verdict['error']}")
        print(f"  {entry['id']} placement {r + 1}/{args.placements} {where}: "
              + "  ".join(f"{n} {times[n][-1] * 1e3:.4g} ms" for n in NAMES), flush=True)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    return {"id": entry["id"], "title": entry["title"], "offsets": rounds,
            "times_s": times, "median_s": med, "min_s": {n: min(t) for n, t in times.items()},
            "max_s": {n: max(t) for n, t in times.items()},
            "tunefarm/metaschedule": med["tunefarm"] / med["metaschedule"]}


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"# Picks over placements: {args.placements} rounds, each argument at a random "
             f"{STEP}-byte step of a page", "",
             "| workload | tunefarm median ms (min–max) | MS median ms (min–max) | "
             "tunefarm/MS |", "|---|---:|---:|---:|"]
    for row in rows:
        cells = [f"{row['median_s'][n] * 1e3:.4g} ({row['min_s'][n] * 1e3:.4g}–"
                 f"{row['max_s'][n] * 1e3:.4g})" for n in NAMES]
        lines.append(f"| {row['id']} {row['title'] or ''} | {cells[0]} | {cells[1]} | "
                     f"{row['tunefarm/metaschedule']:.2f} |")
    return "\n".join(lines) + "\n"


def run_placements(args: argparse.Namespace) -> int:
    from .run import _target

    target = _target(args)
    rng = random.Random(args.seed)
    rows = []
    for entry in select(load_suite(args.suite), args.only):
        print(f"== {entry['id']} {entry['title'] or ''}", flush=True)
        rows.append(time_entry(entry, target, args, rng))
    out = Path(args.out)
    (out / "placements.json").write_text(json.dumps({"target": target, "workloads": rows},
                                                    indent=1))
    md = report(rows, args)
    (out / "placements.md").write_text(md)
    print(md)
    return 0
