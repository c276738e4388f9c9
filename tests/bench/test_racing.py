"""`bench.racing`: racing limits replayed on recorded samples (pure logic, no TVM)."""

from __future__ import annotations

import pytest

from bench.racing import halves, replay

# three repeats per candidate; the second is twice as slow as the first; the third starts cold
# (its first repeat 1.3) but is the fastest
JOB = [(1.0, 1.0, 1.0), (2.0, 2.0, 2.0), (1.3, 0.9, 0.9)]


def test_with_no_limits_every_repeat_is_taken() -> None:
    assert replay(JOB, 0.0, 0.0, 3) == {"repeats": 9, "best": 2, "near_misses": 0}


def test_a_loose_limit_cuts_the_slow_candidate_and_keeps_the_cold_one() -> None:
    # 2.0 > 1.5 x 1.0 after one repeat; the cold one races on and wins
    assert replay(JOB, 1.5, 1.1, 3) == {"repeats": 3 + 1 + 3, "best": 2, "near_misses": 0}


def test_a_tight_limit_loses_the_cold_winner_and_counts_it() -> None:
    # 1.3 > 1.2 x 1.0: cut after one repeat, though all its repeats' median (0.9) beats the best
    assert replay(JOB, 1.2, 1.1, 3) == {"repeats": 3 + 1 + 1, "best": 0, "near_misses": 1}


def test_halves_compares_a_full_and_a_half_screen(capsys: pytest.CaptureFixture[str]) -> None:
    """Ten halves per candidate: the job's first is timed in full (no best to race); a slow one
    after it is cut after its screen, which costs a whole repeat or half of one."""
    jobs = {"J": [(1e-3,) * 10, (2e-3,) * 10]}
    assert halves(jobs, 5, [(1.2, 1.05)]) == 0
    full, half = capsys.readouterr().out.splitlines()
    assert "full first repeat: 6 repeats, near misses 0" in full
    assert "half first repeat: 5.5 repeats, near misses 0" in half
    assert "slower than the best by 0.00% on average" in half
