"""Tuner seeds of the model suite (`--seeds 0,1,2`): each seed tunes both tuners once on the
same model (torch's weights come from `--seed`), every build is timed in the one interleaved
run, and a tuner's figure is the median over its seeds' medians, with the fastest and slowest
seed beside it.

With one seed the variants are named `tunefarm` and `metaschedule`; with several,
`tunefarm@SEED` and `metaschedule@SEED`.
"""

from __future__ import annotations

import statistics
from typing import Any

TUNERS = ("tunefarm", "metaschedule")


def parse(text: str) -> list[int]:
    """`"0,1,2"` -> [0, 1, 2]; distinct, in the order given."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, not {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds: one or more distinct integers, not {text!r}")
    return seeds


def label(tuner: str, seed: int, seeds: list[int]) -> str:
    return tuner if len(seeds) == 1 else f"{tuner}@{seed}"


def tuner_of(name: str) -> str:
    """The tuner a variant's name belongs to (`tunefarm@2` -> `tunefarm`)."""
    return name.split("@", 1)[0]


def work_suffix(seed: int, seeds: list[int]) -> str:
    """Of a seed's work folder: the first seed keeps the single-seed folder's name, so
    `--reuse-tuning` finds a single-seed run's databases."""
    return "" if seed == seeds[0] else f"-seed{seed}"


def aggregate(timing: dict[str, dict[str, Any]], tuner: str) -> dict[str, Any] | None:
    """A tuner's median over its seeds' median latencies (a seed whose build gave no correct
    output counts as missing and is named), with the spread; None when no seed ran."""
    runs = {name: v for name, v in timing.items() if tuner_of(name) == tuner}
    if not runs:
        return None
    good = {name: v["median_s"] for name, v in runs.items()
            if v.get("median_s") and v.get("status", "ok") == "ok"}
    out: dict[str, Any] = {"seeds": len(runs), "per_seed_s": good,
                           "failed": sorted(set(runs) - set(good))}
    if good:
        xs = list(good.values())
        out.update(median_s=statistics.median(xs), min_s=min(xs), max_s=max(xs))
    return out


def tuned(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{variant name: tuning info} of a model's result (runs before `--seeds` kept one info per
    tuner under the tuner's name)."""
    if "tuning" in result:
        return result["tuning"]
    return {t: result[t] for t in TUNERS if result.get(t)}


def median_s(result: dict[str, Any], tuner: str) -> float | None:
    """A tuner's latency for a model's result: the median over seeds where there are several."""
    agg = (result.get("seeds") or {}).get(tuner)
    if agg is not None:
        return agg.get("median_s")
    return result["timing"].get(tuner, {}).get("median_s")


def spread(result: dict[str, Any], tuner: str) -> str:
    """`" (3 seeds: 10.2-11.0)"` in ms, or `""` for a single-seed result."""
    agg = (result.get("seeds") or {}).get(tuner)
    if not agg or agg["seeds"] < 2:
        return ""
    rng = (f": {agg['min_s'] * 1e3:.3f}-{agg['max_s'] * 1e3:.3f} ms" if agg.get("min_s")
           else "")
    bad = f", {len(agg['failed'])} without a correct build" if agg["failed"] else ""
    return f" ({agg['seeds']} seeds{rng}{bad})"
