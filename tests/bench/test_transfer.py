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


def test_the_shortlist_holds_the_earliest_programs_near_the_goal_and_the_fastest() -> None:
    from bench.side_by_side import shortlist

    goal = 1.0e-3
    trials = [("a", 2.0e-3), ("b", 1.05e-3), ("c", None), ("b", 1.0e-3), ("d", 1.09e-3),
              ("e", 0.99e-3), ("f", 1.2e-3), ("g", 0.90e-3)]
    # within 1.10 × goal, in trial order, each once: b, d, e; then g, the fastest
    assert shortlist(trials, goal, first=3) == ["b", "d", "e", "g"]
    assert shortlist(trials, goal, first=1) == ["b", "g"]
    assert shortlist(trials, goal, slack=1.0, first=4) == ["b", "e", "g"]  # b: its 2nd timing
    assert shortlist([("a", None)], goal) == []


def test_a_program_reaches_the_goal_when_timed_within_it_beside_the_best() -> None:
    from bench.side_by_side import reaching

    timed = {"best": 1.0e-3, "near": 1.05e-3, "far": 1.06e-3, "broken": None}
    assert reaching(timed, "best") == {"best", "near"}  # 1.0 / 0.95 = 1.0526
    assert reaching(timed, "broken") == frozenset()  # the reference itself failed
    assert reaching(timed, "missing") == frozenset()


def test_both_runs_are_scored_on_the_programs_that_reached_the_goal_side_by_side() -> None:
    reach = frozenset({"c", "y"})
    cold = [("a", 1.3e-3), ("y", 1.2e-3), ("c", 1.0e-3)]  # y timed slow here, fast beside c
    assert trials_to(cold, 0.0, 64, reach) == 2
    assert trials_to([("x", 1.0e-3)], 0.0, 64, reach) == 128
