"""Drawing candidates for a batch without the model's evolution: random points of the design
space, and a mix of two candidate lists."""

from __future__ import annotations

from typing import Any

from tuner.core import tvm_api as tv


def sample_space(strategy: tv.ms.search_strategy.EvolutionarySearch,
                 args_info: list[tv.ms.arg_info.ArgInfo], n: int) -> list[tv.ms.MeasureCandidate]:
    """About 1.5 `n` random points of the design space (each design space's trace replayed with
    fresh decisions, then postprocessed), without evolution. `strategy` is a pre-tuned
    EvolutionarySearch; it returns at least its `init_min_unmeasured` points."""
    return [tv.ms.MeasureCandidate(sch, args_info)
            for sch in tv.sample_init_population(strategy, n + n // 2)]


def interleave(a: list[Any], b: list[Any]) -> list[Any]:
    """a[0], b[0], a[1], b[1], ... then the rest of the longer one."""
    out = [x for pair in zip(a, b, strict=False) for x in pair]
    return out + a[len(b):] + b[len(a):]
