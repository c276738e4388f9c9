"""How much of a job's latency each knob explains: ω² (omega squared), the effect size of a
one-way analysis of variance, per knob, over the log latency of the valid measurements.

ω² = (SS_between - (g - 1) MS_within) / (SS_total + MS_within) for the g values a knob took: the
share of the variance of log latency that the knob's value alone accounts for, corrected for the
number of values (η² = SS_between / SS_total would give a knob whose every value appears once a
perfect 1). It is fANOVA's first-order term estimated from the measurements themselves rather
than from a random forest's marginals: interactions between knobs are not separated, and the
search's sampling is not uniform, so read it as "what varied with latency in this job", not as a
causal ranking. Log latency, because a knob's effect on a kernel is a factor, not an offset.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

MIN_POINTS = 4  # fewer valid measurements: nothing is estimated


def _key(v: object) -> str:
    return json.dumps(v, sort_keys=True)


def omega_squared(values: Sequence[Any], latencies: Sequence[float]) -> float | None:
    """ω² of one knob: `values[i]` its value in measurement i, `latencies[i]` > 0 its latency.
    None where it cannot be estimated (too few measurements, or as many values as
    measurements); 0 for a knob that never varied or explains less than chance."""
    n = len(latencies)
    if n < MIN_POINTS or len(values) != n:
        return None
    y = [math.log(t) for t in latencies]
    groups: dict[str, list[float]] = {}
    for v, yi in zip(values, y, strict=True):
        groups.setdefault(_key(v), []).append(yi)
    g = len(groups)
    if g >= n:
        return None
    mean = sum(y) / n
    ss_total = sum((yi - mean) ** 2 for yi in y)
    if g == 1 or ss_total == 0.0:
        return 0.0
    ss_between = sum(len(ys) * (sum(ys) / len(ys) - mean) ** 2 for ys in groups.values())
    ms_within = (ss_total - ss_between) / (n - g)
    w2 = (ss_between - (g - 1) * ms_within) / (ss_total + ms_within)
    return min(1.0, max(0.0, w2))


def knob_importance(knobs: Mapping[str, Sequence[Any]], latencies: Sequence[float | None],
                    ok: Sequence[bool]) -> dict[str, float | None]:
    """ω² of every knob over the valid measurements (`ok[i]` and a latency), where the knob has
    a value: `knobs[name][i]` is None where measurement i did not name it."""
    out: dict[str, float | None] = {}
    for name, column in knobs.items():
        pairs = [(v, t) for v, t, good in zip(column, latencies, ok, strict=True)
                 if good and v is not None and t is not None and t > 0]
        out[name] = omega_squared([v for v, _ in pairs], [t for _, t in pairs])
    return out
