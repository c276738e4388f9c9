"""The tuning curves' arithmetic (bench/curves.py): best so far per task, weighted over tasks."""

from __future__ import annotations

import math

from bench.curves import best_so_far


def test_one_task_keeps_the_best_so_far_and_skips_failures() -> None:
    points = best_so_far([(1.0, 0, 1.0, [3.0, math.inf, 2.0]), (2.5, 0, 1.0, [2.5, 1.0]),
                          (3.0, 0, 1.0, [math.inf])])
    assert points == [[3, 1.0, 2.0], [5, 2.5, 1.0], [6, 3.0, 1.0]]  # a point per batch


def test_a_model_is_estimated_once_every_task_has_a_valid_candidate() -> None:
    # task 0 (weight 2) then task 1 (weight 3): no estimate while task 1 has only a failure
    batches = [(1.0, 0, 2.0, [4.0]), (2.0, 1, 3.0, [math.inf]), (3.0, 1, 3.0, [1.0]),
               (4.0, 0, 2.0, [5.0, 2.0])]
    points = best_so_far(batches)
    assert [p[2] for p in points] == [8.0, None, 11.0, 7.0]
    assert [p[0] for p in points] == [1, 2, 3, 5]
    # a model of three tasks: the two seen are no estimate of it
    assert [p[2] for p in best_so_far(batches, n_tasks=3)] == [None] * 4
    assert best_so_far([*batches, (5.0, 2, 1.0, [0.5])], n_tasks=3)[-1] == [6, 5.0, 7.5]


def test_no_batches_no_points() -> None:
    assert best_so_far([]) == []
