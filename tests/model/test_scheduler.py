"""The gradient-based task scheduler of model jobs (pure logic)."""

from __future__ import annotations

from tuner.model.scheduler import GradientScheduler


def test_every_task_gets_a_first_round_heaviest_first() -> None:
    s = GradientScheduler([1, 3, 2])
    order = []
    for _ in range(3):
        i = s.pick()
        assert i is not None
        order.append(i)
        s.update(i, 16, 1e-3, exhausted=False)
    assert order == [1, 2, 0]
    assert s.estimate_s() == 6e-3


def test_a_task_without_a_valid_program_comes_before_gradients() -> None:
    s = GradientScheduler([1, 1], warm=[(16, 1e-3), (16, None)])
    assert s.pick() == 1 and s.estimate_s() is None


def test_a_task_that_never_gets_a_valid_program_is_given_up() -> None:
    # every candidate a wrong answer (say): after 3 rounds it stops taking the budget
    s = GradientScheduler([1, 1], warm=[(16, 1e-3), (16, None)])
    for trials in (32, 48):
        assert s.pick() == 1
        s.update(1, trials, None, exhausted=False)
    assert s.hopeless(1) and not s.hopeless(0)
    assert s.pick() == 0 and s.estimate_s() is None
    s.update(0, 32, 1e-3, exhausted=True)
    assert s.pick() is None  # nothing left that can gain: the model job ends


def test_the_round_goes_where_weight_times_expected_gain_is_largest() -> None:
    s = GradientScheduler([1, 1, 10])
    for i, best in ((0, 4e-3), (1, 4e-3), (2, 1e-3)):
        s.update(i, 16, best, exhausted=False)
    # task 2 is 4x faster but called 10x as often: 10 × 1e-3 outweighs 1 × 4e-3
    assert s.pick() == 2
    s.update(2, 32, 1e-3, exhausted=False)  # no progress: its backward gradient is 0
    s.update(2, 48, 1e-3, exhausted=False)
    s.update(0, 32, 2e-3, exhausted=False)
    gains = [s._gain(i) for i in range(3)]
    assert s.pick() == max(range(3), key=lambda i: gains[i])


def test_a_task_that_keeps_improving_beats_a_stalled_one() -> None:
    s = GradientScheduler([1, 1], warm=[(16, 4e-3), (16, 2e-3)])
    s.update(0, 32, 2e-3, exhausted=False)  # halved its latency in its last round
    s.update(1, 32, 2e-3, exhausted=False)  # the same latency, no progress
    assert s.pick() == 0


def test_exhausted_tasks_get_no_more_rounds() -> None:
    s = GradientScheduler([5, 1])
    s.update(0, 10, 1e-3, exhausted=True)
    s.update(1, 16, 1e-3, exhausted=False)
    assert s.pick() == 1
    s.update(1, 20, 1e-3, exhausted=True)
    assert s.pick() is None
