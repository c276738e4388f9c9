"""Where the next batch of a model's trial budget goes: the gradient-based task scheduler of
Ansor (Zheng et al., OSDI 2020), in tunefarm's terms. Pure logic, no TVM.

The model's latency is estimated as Σ weightᵢ × bestᵢ. Each round gives one task a batch of
trials; the next round goes to the task whose weight × expected latency drop per trial is the
largest, the expectation mixing
- the backward gradient: how much its best fell per trial over its last `window` rounds, and
- an optimistic forward gradient: its best spread over the trials it has had (a task that
  improved early may improve again).
Every task gets a first round before any gradient is trusted (a task already tuned on this
target counts as having had it). A task whose round measured nothing new (its space is
exhausted, or it stopped early) gets no more rounds, nor does one still without a valid program
after `give_up_rounds` rounds (every candidate failing to build, run or match the reference is
the task's problem, not the search's: the build keeps its default schedule and says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TaskState:
    weight: int
    trials: int = 0
    best_s: float | None = None
    history: list[tuple[int, float | None]] = field(default_factory=list)  # (trials, best)
    done: bool = False  # nothing more to gain from it


class GradientScheduler:
    """Picks the task for the next round (`pick`) and learns each round's outcome (`update`)."""

    def __init__(self, weights: list[int], *, window: int = 3, alpha: float = 0.2,
                 give_up_rounds: int = 3,
                 warm: list[tuple[int, float | None]] | None = None) -> None:
        """`warm`: (trials, best) each task already has on this target (0, None: none)."""
        self.tasks = [TaskState(w) for w in weights]
        self.window, self.alpha, self.give_up_rounds = window, alpha, give_up_rounds
        for task, (trials, best) in zip(self.tasks, warm or [], strict=False):
            task.trials, task.best_s = trials, best
            task.history.append((trials, best))

    @classmethod
    def restore(cls, tasks: list[TaskState]) -> GradientScheduler:
        """A scheduler in the state a stored model job left it (`tuner.model.rounds`)."""
        sched = cls([t.weight for t in tasks])
        sched.tasks = tasks
        return sched

    def estimate_s(self) -> float | None:
        """Σ weight × best latency; None while a task has no valid measurement yet."""
        if any(t.best_s is None for t in self.tasks):
            return None
        return sum(t.weight * (t.best_s or 0.0) for t in self.tasks)

    def update(self, i: int, trials: int, best_s: float | None, *, exhausted: bool) -> None:
        """Task `i` now has `trials` trials and best `best_s`; `exhausted`: its round gave no
        new measurement."""
        task = self.tasks[i]
        task.trials, task.best_s = trials, best_s
        task.history.append((trials, best_s))
        task.done = task.done or exhausted

    def pick(self) -> int | None:
        """The task of the next round, or None when no task can gain anything."""
        live = [i for i, t in enumerate(self.tasks) if not t.done and not self.hopeless(i)]
        if not live:
            return None
        fresh = [i for i in live if self.tasks[i].trials == 0]
        if fresh:  # a first round for everyone, heaviest first
            return max(fresh, key=lambda i: self.tasks[i].weight)
        unmeasured = [i for i in live if self.tasks[i].best_s is None]
        if unmeasured:  # no valid program yet: its latency is unknown, maybe the largest
            return min(unmeasured, key=lambda i: self.tasks[i].trials)
        return max(live, key=self._gain)

    def hopeless(self, i: int) -> bool:
        """Task `i` had `give_up_rounds` rounds and not one valid program."""
        t = self.tasks[i]
        return t.best_s is None and sum(1 for n, _ in t.history if n > 0) >= self.give_up_rounds

    def _gain(self, i: int) -> float:
        """weight × expected latency drop per trial (larger: more to gain)."""
        t = self.tasks[i]
        best = t.best_s if t.best_s is not None else math.inf
        past = [(n, b) for n, b in t.history if b is not None]
        backward = 0.0
        if len(past) >= 2:
            n0, b0 = past[max(0, len(past) - 1 - self.window)]
            n1, b1 = past[-1]
            backward = (b0 - b1) / max(1, n1 - n0)
        forward = best / max(1, t.trials)
        return t.weight * (self.alpha * backward + (1 - self.alpha) * forward)
