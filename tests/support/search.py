"""Helpers for testing the search loop without hardware: a deterministic synthetic measurement
(the fallback of a `tuner.measure.replay.ReplayMeasurer`) and a small evolutionary search."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.measure import Invalidity, MeasureInput, MeasureResult

SMALL_POPULATION = 16


def small_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `Tuner.run` use an evolutionary search of 16 programs and one generation for every
    space (templates size theirs at 64-512): the loop is under test, not MetaSchedule's search
    quality, and a search step then costs a tenth of a second instead of seconds."""
    from tuner.core import tvm_api as tv
    from tuner.search import loop

    def strategy(name: str) -> Any:
        return tv.ms.search_strategy.EvolutionarySearch(
            population_size=SMALL_POPULATION, genetic_num_iters=1,
            init_min_unmeasured=SMALL_POPULATION // 2)

    monkeypatch.setattr(loop, "search_strategy", strategy)


class Synthetic:
    """A deterministic made-up measurement per candidate, from its structural hash: a latency of
    10-10,000 us, a RUN_ERROR for one candidate in seven. `lose_first`: the first attempt at the
    first candidate, and at one candidate in five, is lost (WORKER_LOST); its retry measures."""

    def __init__(self, *, lose_first: bool = False) -> None:
        self.lose_first = lose_first
        self.calls = 0
        self.lost: list[str] = []  # trial ids of the lost attempts

    def __call__(self, inp: MeasureInput) -> MeasureResult:
        self.calls += 1
        cand = str((inp.context or {})["cand_hash"])
        h = int(cand[:8], 16)
        if self.lose_first and (self.calls == 1 or h % 5 == 0) and inp.trial_id not in self.lost:
            self.lost.append(inp.trial_id)
            return MeasureResult.failure(inp.trial_id, Invalidity.WORKER_LOST, "board went away")
        if h % 7 == 0:
            return MeasureResult.failure(inp.trial_id, Invalidity.RUN_ERROR, "synthetic crash")
        lat = 1e-5 * (1 + h % 1000)
        return MeasureResult(inp.trial_id, Invalidity.OK, (lat, lat * 1.01, lat * 0.99))
