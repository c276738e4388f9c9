"""Measurers that measure nothing, for tests of what drives a measurer (the worker agent, the
search loop). Each subclasses `tuner.measure.Measurer` and keeps its contract: failures are
results, WORKER_LOST stands for a board that went away."""

from __future__ import annotations

import threading
import time

from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult


def ok_result(inp: MeasureInput, worker: str = "fake") -> MeasureResult:
    """A deterministic fake latency per trial (from the trial id's last four hex digits; a
    confirmation measures what the trial it confirms measured)."""
    tid = (inp.context or {}).get("confirms") or inp.trial_id
    lat = 1e-4 * (1 + int(tid[-4:], 16) % 97)
    return MeasureResult(inp.trial_id, Invalidity.OK, (lat, lat * 1.01, lat * 0.99),
                         worker=worker)


class FakeMeasurer(Measurer):
    """Returns a made-up result after `delay_s`; `outcome` maps trial ids to invalidities."""

    def __init__(self, worker_id: str, delay_s: float = 0.0,
                 outcome: dict[str, Invalidity] | None = None) -> None:
        self.worker_id, self.delay_s, self.outcome = worker_id, delay_s, outcome or {}
        self.measured: list[str] = []
        self.prepared: list[list[str]] = []
        self.started = threading.Event()
        self.closed = False

    def prepare(self, inputs: list[MeasureInput]) -> None:
        self.prepared.append([i.trial_id for i in inputs])

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        self.started.set()
        time.sleep(self.delay_s)
        self.measured.append(inp.trial_id)
        inv = self.outcome.get(inp.trial_id, Invalidity.OK)
        if inv is Invalidity.OK:
            return MeasureResult(inp.trial_id, inv, (1e-4, 1.1e-4, 0.9e-4), worker=self.worker_id)
        return MeasureResult.failure(inp.trial_id, inv, f"fake {inv}", worker=self.worker_id)

    def close(self) -> None:
        self.closed = True


class FlakyBoard(FakeMeasurer):
    """A board whose first `lost` measurements fail outside the kernel (WORKER_LOST); its health
    probe passes once `healthy` is set."""

    def __init__(self, worker_id: str, lost: int = 0) -> None:
        super().__init__(worker_id)
        self.lost, self.probes, self.healthy = lost, 0, threading.Event()

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        if self.lost > 0:
            self.lost -= 1
            self.measured.append(inp.trial_id)
            return MeasureResult.failure(inp.trial_id, Invalidity.WORKER_LOST, "board gone",
                                         worker=self.worker_id)
        return super().measure_one(inp)

    def probe(self) -> bool:
        self.probes += 1
        return self.healthy.is_set()


class FlakyMeasurer(Measurer):
    """Wraps a measurer and loses every other attempt (as a dead board would), measuring the
    others for real; `always_lose` loses them all. `calls` counts the attempts."""

    def __init__(self, inner: Measurer, *, always_lose: bool = False) -> None:
        self.inner, self.always_lose, self.calls = inner, always_lose, 0

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        self.calls += 1
        if self.always_lose or self.calls % 2 == 1:
            return MeasureResult.failure(inp.trial_id, Invalidity.WORKER_LOST, "board went away")
        return self.inner.measure_one(inp)
