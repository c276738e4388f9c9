"""How `tuner.measure.evaluate.time_kernel` drives TVM's time_evaluator (pure logic, with a
fake module whose kernel takes a known time; the real evaluator is exercised by test_local and
test_rpc)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.measure import MeasureOptions
from tuner.measure.evaluate import (
    CALIBRATION_HEADROOM,
    REPEAT_FLOOR,
    SCREEN_FRACTION,
    calls_per_repeat,
    time_kernel,
)


@dataclass
class FakeModule:
    """A kernel of `per_call_s` seconds: calling it sleeps that long (the first call `first_s`);
    `time_evaluator` reports that time and records how it was asked."""

    per_call_s: float
    first_s: float | None = None
    calls: int = 0
    evaluators: list[dict[str, Any]] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        assert name == "main"

        def call(*_args: Any) -> None:
            self.calls += 1
            time.sleep(self.first_s if self.calls == 1 and self.first_s is not None
                       else self.per_call_s)
        return call

    def time_evaluator(self, name: str, dev: Any, **kw: Any) -> Any:
        assert name == "main"
        self.evaluators.append(kw)
        repeat = kw.get("repeat", 1)
        return lambda *_a: SimpleNamespace(mean=self.per_call_s,
                                           results=[self.per_call_s] * repeat)


DEV = SimpleNamespace(sync=lambda: None)


def assert_calibrated_once(screen: dict[str, Any], rest: list[dict[str, Any]], per_call_s: float,
                           min_repeat_ms: float) -> None:
    """One calibration for all the repeats; the screen (the first) is SCREEN_FRACTION of them."""
    full = math.ceil(CALIBRATION_HEADROOM * min_repeat_ms / (per_call_s * 1e3))
    assert all(e["number"] == full for e in rest)
    assert screen["number"] == math.ceil(SCREEN_FRACTION * full) < full


def test_a_fast_kernel_gets_a_calibrated_count_with_headroom() -> None:
    rt = FakeModule(per_call_s=50e-6)
    n = calls_per_repeat(rt, [], 40.0, DEV)
    assert n == pytest.approx(CALIBRATION_HEADROOM * 40.0 / 0.05, abs=1)
    probe = rt.evaluators[0]
    assert probe["number"] == 1 and probe["repeat"] == 1 and probe["min_repeat_ms"] == 5


def test_a_kernel_that_fills_a_repeat_alone_is_not_probed() -> None:
    rt = FakeModule(per_call_s=0.03, first_s=0.03)
    assert calls_per_repeat(rt, [], 20.0, DEV) == 1
    assert rt.evaluators == [] and rt.calls == 1


def test_time_kernel_keeps_the_protocol() -> None:
    rt = FakeModule(per_call_s=100e-6)
    lat = time_kernel(rt, [], MeasureOptions(min_repeat_ms=10, repeats=4), DEV)
    assert lat == (100e-6,) * 4
    timed = rt.evaluators[-1]
    # each repeat is sized to last min_repeat_ms; TVM re-runs one that lasted under the floor
    assert timed["repeat"] == 4 and timed["min_repeat_ms"] == REPEAT_FLOOR * 10
    assert timed["number"] * 100e-6 * 1e3 >= 10


def test_cache_flush_times_single_calls_without_calibration() -> None:
    rt = FakeModule(per_call_s=100e-6)
    time_kernel(rt, [], MeasureOptions(cache_flush=True, repeats=3), DEV)
    (only,) = rt.evaluators
    assert only["number"] == 1 and only["repeat"] == 3 and "f_preproc" in only
    assert rt.calls == 0


@pytest.mark.parametrize("flush", [False, True])
def test_a_kernel_slower_than_the_prune_limit_gets_one_repeat(flush: bool) -> None:
    rt = FakeModule(per_call_s=400e-6)  # best 200 µs, factor 1.5: the limit is 300 µs
    opts = MeasureOptions(min_repeat_ms=10, repeats=5, cache_flush=flush,
                          verify_below_s=200e-6, prune_factor=1.5)
    assert time_kernel(rt, [], opts, DEV) == (400e-6,)
    assert rt.evaluators[-1]["repeat"] == 1


@pytest.mark.parametrize(("per_call_s", "repeats_asked"), [
    (250e-6, (1, 2)),  # within the limit but slower than the best: three repeats end it
    (100e-6, (1, 3, 1)),  # a new best: every repeat (three could have ended it)
])
def test_a_kernel_within_the_prune_limit_races_on(per_call_s: float,
                                                   repeats_asked: tuple[int, ...]) -> None:
    rt = FakeModule(per_call_s=per_call_s)
    opts = MeasureOptions(min_repeat_ms=10, repeats=5, verify_below_s=200e-6, prune_factor=1.5)
    assert time_kernel(rt, [], opts, DEV) == (per_call_s,) * sum(repeats_asked)
    screen, *rest = rt.evaluators[-len(repeats_asked):]
    assert (screen["repeat"], *(e["repeat"] for e in rest)) == repeats_asked
    assert_calibrated_once(screen, rest, per_call_s, 10)


@pytest.mark.parametrize(("per_call_s", "repeats_asked"), [
    (400e-6, (1,)),  # slower than best x 1.5: one repeat
    (250e-6, (1, 1)),  # within 1.5, slower than best x 1.1: two
    (210e-6, (1, 1, 1)),  # within both, but 3 of 5 slower than the best: so is the median
    (100e-6, (1, 1, 3)),  # a new best: every repeat, calibrated once
])
def test_a_kernel_races_the_best_over_its_first_two_repeats(
        per_call_s: float, repeats_asked: tuple[int, ...]) -> None:
    rt = FakeModule(per_call_s=per_call_s)
    opts = MeasureOptions(min_repeat_ms=10, repeats=5, verify_below_s=200e-6, prune_factor=1.5,
                          confirm_factor=1.1)
    assert time_kernel(rt, [], opts, DEV) == (per_call_s,) * sum(repeats_asked)
    screen, *rest = rt.evaluators[-len(repeats_asked):]
    assert (screen["repeat"], *(e["repeat"] for e in rest)) == repeats_asked
    assert_calibrated_once(screen, rest, per_call_s, 10)


def test_the_second_limit_reads_the_faster_of_two_repeats() -> None:
    """A cold first repeat past the second limit does not end the timing: the faster of the two
    decides."""
    rt = FakeModule(per_call_s=0.0)
    samples = iter([260e-6, 190e-6, 190e-6, 190e-6, 190e-6])
    rt.time_evaluator = lambda name, dev, **kw: (  # type: ignore[method-assign]
        lambda *_a: SimpleNamespace(results=[next(samples) for _ in range(kw["repeat"])]))
    opts = MeasureOptions(min_repeat_ms=0, repeats=5, verify_below_s=200e-6, prune_factor=1.5,
                          confirm_factor=1.1)
    assert time_kernel(rt, [], opts, DEV) == (260e-6,) + (190e-6,) * 4


def scripted(samples: list[float]) -> FakeModule:
    """A module whose repeats read `samples` in turn."""
    rt = FakeModule(per_call_s=100e-6)
    it = iter(samples)

    def evaluator(name: str, dev: Any, **kw: Any) -> Any:
        rt.evaluators.append(kw)
        if kw["number"] == 1:  # the calibration's probe
            return lambda *_a: SimpleNamespace(mean=rt.per_call_s)
        return lambda *_a: SimpleNamespace(results=[next(it) for _ in range(kw["repeat"])])
    rt.time_evaluator = evaluator  # type: ignore[method-assign]
    return rt


@pytest.mark.parametrize(("samples", "repeats_asked"), [
    ([190e-6, 210e-6, 210e-6, 210e-6, 210e-6], (1, 1, 2)),  # the 3rd slower one ends it at 4
    ([210e-6, 190e-6, 190e-6, 210e-6, 210e-6], (1, 1, 2, 1)),  # the 3rd slower one is the 5th
    ([210e-6, 190e-6, 190e-6, 190e-6, 210e-6], (1, 1, 2, 1)),  # a new best: all five
    ([190e-6, 190e-6, 210e-6, 210e-6, 210e-6], (1, 1, 3)),  # can no longer lose: the rest at once
])
def test_a_kernel_stops_once_its_median_cannot_beat_the_best(
        samples: list[float], repeats_asked: tuple[int, ...]) -> None:
    """Once more than half of its five repeats read slower than the best, the median of five
    would too: the timing ends there, in as few time_evaluator calls as that takes."""
    rt = scripted(samples)
    # repeats of 1 s: a first call slowed past a whole repeat by a loaded machine (which makes
    # time_kernel skip the calibration probe the script expects) would take a second
    opts = MeasureOptions(min_repeat_ms=1000, repeats=5, verify_below_s=200e-6,
                          prune_factor=1.5, confirm_factor=1.1)
    got = time_kernel(rt, [], opts, DEV)
    assert got == tuple(samples[:sum(repeats_asked)])
    assert tuple(e["repeat"] for e in rt.evaluators[1:]) == repeats_asked
    if len(got) < 5:  # the median of all five would not have beaten the best either
        assert sorted(samples)[2] > 200e-6


def test_a_kernel_that_fills_a_repeat_alone_is_not_stepped() -> None:
    """With one call per repeat, another time_evaluator call costs a whole untimed repeat: past
    the limits the repeats are timed at once."""
    rt = FakeModule(per_call_s=0.03, first_s=0.03)
    opts = MeasureOptions(min_repeat_ms=20, repeats=5, verify_below_s=0.029, prune_factor=1.5,
                          confirm_factor=1.1)
    assert time_kernel(rt, [], opts, DEV) == (0.03,) * 5
    assert tuple(e["repeat"] for e in rt.evaluators) == (1, 1, 3)


def test_with_the_second_limit_alone_the_first_repeat_never_ends_the_timing() -> None:
    rt = FakeModule(per_call_s=400e-6)
    opts = MeasureOptions(min_repeat_ms=10, repeats=5, verify_below_s=200e-6, prune_factor=0.0,
                          confirm_factor=1.1)
    assert time_kernel(rt, [], opts, DEV) == (400e-6,) * 2


@pytest.mark.parametrize("opts", [
    MeasureOptions(repeats=5, prune_factor=1.5, confirm_factor=1.1),  # no best yet
    MeasureOptions(repeats=5, verify_below_s=1e-6, prune_factor=0.0),  # pruning off
    MeasureOptions(repeats=1, verify_below_s=1e-6, prune_factor=1.5,
                   confirm_factor=1.1),  # nothing to save
])
def test_without_a_limit_every_repeat_is_timed_at_once(opts: MeasureOptions) -> None:
    rt = FakeModule(per_call_s=400e-6)
    assert len(time_kernel(rt, [], opts, DEV)) == opts.repeats
    assert rt.evaluators[-1]["repeat"] == opts.repeats


@pytest.mark.parametrize("flush", [False, True])
def test_the_first_repeat_of_a_racing_kernel_is_a_shorter_screen(flush: bool) -> None:
    """The repeat the first limit reads lasts SCREEN_FRACTION of the others (calls, and the
    floor below which TVM runs it again); a kernel with no best to race, or with the first limit
    off, gets full repeats only; with a cache flush every repeat is one call anyway."""
    racing = MeasureOptions(min_repeat_ms=10, repeats=5, cache_flush=flush,
                            verify_below_s=200e-6, prune_factor=1.5, confirm_factor=1.1)
    rt = FakeModule(per_call_s=100e-6)
    time_kernel(rt, [], racing, DEV)
    screen, full = rt.evaluators[-3], rt.evaluators[-2]
    if flush:
        assert screen == full
    else:
        assert screen["number"] == math.ceil(SCREEN_FRACTION * full["number"]) < full["number"]
        assert screen["min_repeat_ms"] == math.ceil(REPEAT_FLOOR * SCREEN_FRACTION * 10)
    for opts in (MeasureOptions(min_repeat_ms=10, repeats=5),
                 MeasureOptions(min_repeat_ms=10, repeats=5, verify_below_s=200e-6,
                                prune_factor=0.0, confirm_factor=1.1)):
        rt = FakeModule(per_call_s=100e-6)
        time_kernel(rt, [], opts, DEV)
        assert len({e["number"] for e in rt.evaluators[1:]}) == 1
