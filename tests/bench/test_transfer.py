"""The transfer benchmark's "trials to 95% of the cold best" (pure logic)."""

from __future__ import annotations

from bench.transfer import trials_to

COLD = [("a", 1.3e-3), ("b", None), ("c", 1.0e-3), ("d", 1.1e-3)]


def test_the_first_trial_timed_within_the_goal() -> None:
    assert trials_to(COLD, 1.0e-3 / 0.95, 64) == 3
    assert trials_to(COLD, 0.5e-3, 64) == 128  # never: twice the budget


def test_a_program_the_other_run_timed_within_the_goal_counts_whatever_this_run_timed() -> None:
    warm = [("x", 2.0e-3), ("c", 1.2e-3), ("y", 1.0e-3)]  # "c" timed slower here: noise
    goal = 1.0e-3 / 0.95
    assert trials_to(warm, goal, 64) == 3
    assert trials_to(warm, goal, 64, frozenset({"c"})) == 2
    assert trials_to([("c", None)], goal, 64, frozenset({"c"})) == 128  # failed here
