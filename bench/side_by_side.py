"""The transfer benchmark's judge: which measured programs reach the goal, timed side by side.

A cold run and a warm run of one workload are timed minutes apart, and on a shared machine a
kernel's time moves by more than the 5% the goal allows from one minute to the next (Run AB:
the same 16 programs of F21, timed 9% slower as a whole in the warm run). Deciding "this trial
reached 95% of the cold best" from each run's own timing measures that drift as much as the
search. The judge takes the programs that could have reached the goal in either run, compiles
them, and times them in one process, interleaved round by round (`bench.timing`), beside the
cold run's best program; a program reaches the goal when its median is within 1/0.95 of that
best's median in the same rounds. Both runs are then scored by the same rule: the first trial
that measured a program which reached it.

Which programs are timed again (`shortlist`): per run, the first `first` distinct programs that
run timed within `slack` × the goal, and the run's fastest. A run's trials to the goal can only
be judged on the programs it timed no worse than that (a trial that timed much slower than the
goal is taken at its word).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Trials = list[tuple[str, float | None]]  # (program hash, latency or None) in trial order

SLACK = 1.10  # programs timed within 1.10 × the goal (1.16 × the cold best) are timed again
FIRST = 4  # per run, at most this many of them (the earliest) beside the run's fastest
ROUNDS = 7
MIN_MS = 25.0  # each timing repeats the kernel for at least this long
PAUSE_S = 0.05  # after each timing (TVM kernels only: no other library's threads to settle)


def shortlist(trials: Trials, goal_s: float, *, slack: float = SLACK,
              first: int = FIRST) -> list[str]:
    """The programs of one run worth timing again: the first `first` distinct ones timed within
    `slack` × `goal_s`, then the run's fastest (if it is not among them)."""
    picked: list[str] = []
    for h, lat in trials:
        if len(picked) >= first:
            break
        if lat is not None and lat <= slack * goal_s and h not in picked:
            picked.append(h)
    valid = [(lat, h) for h, lat in trials if lat is not None]
    if valid:
        fastest = min(valid)[1]
        if fastest not in picked:
            picked.append(fastest)
    return picked


def reaching(retimed: dict[str, float | None], best: str, ratio: float = 0.95) -> frozenset[str]:
    """The programs whose side-by-side median is within 1/`ratio` of the `best` program's.
    Empty when `best` itself could not be timed again."""
    ref = retimed.get(best)
    if ref is None or not math.isfinite(ref):
        return frozenset()
    goal = ref / ratio
    return frozenset(h for h, t in retimed.items() if t is not None and t <= goal)


def retime(wl: Any, traces: dict[str, str], target: dict[str, Any], *, rounds: int,
           min_ms: float, pause_s: float,
           log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Compile each program (its trace replayed on `wl`) and time them all in one process,
    interleaved; {hash: {"median_s": seconds or None, "status": ...}}. A program that fails to
    compile or gives a wrong output is reported with its reason and a median of None."""
    from tuner.core import tvm_api as tv

    from .kernels import prepare, sched_mod_from_trace
    from .timing import Variant, time_interleaved

    inputs = wl.make_inputs(0)
    reference = wl.reference(inputs)
    rtol, atol = wl.tolerance()
    tgt = tv.make_target(target)
    variants: list[Variant] = []
    out: dict[str, dict[str, Any]] = {}
    for h, trace in traces.items():
        try:
            kernel = prepare(sched_mod_from_trace(wl, trace), wl, inputs, tgt)
        except Exception as exc:  # a trace that no longer replays or builds here
            out[h] = {"median_s": None, "status": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        variants.append(Variant(h, kernel=kernel))
    timed = time_interleaved(variants, reference, rtol, atol, rounds=rounds, min_ms=min_ms,
                             log=log, pause_s=pause_s)
    for h, res in timed.items():
        ok = res.get("status") == "ok"
        out[h] = {"median_s": res.get("median_s") if ok else None, "status": res["status"],
                  "rounds_s": res.get("rounds_s")}
    return out
