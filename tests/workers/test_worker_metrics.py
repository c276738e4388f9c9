"""The worker's metrics (workers/agent_metrics.py): every measurement counted by invalidity and
timed (build and run), reclaimed and dead-lettered entries counted at the API client. The real
worker process is scraped in tests/e2e/test_metrics.py."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from workers import agent_metrics as metrics

OUTCOMES = {"a": (Invalidity.OK, 0.3), "b": (Invalidity.WRONG_ANSWER, 0.2),
            "c": (Invalidity.WORKER_LOST, None), "d": (Invalidity.BUILD_ERROR, None)}


class Board(Measurer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare(self, inputs: list[MeasureInput]) -> None:
        self.calls.append("prepare")

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        time.sleep(0.02)
        inv, build_s = OUTCOMES[inp.trial_id]
        if inv is Invalidity.OK:
            return MeasureResult(inp.trial_id, inv, (1e-4,), build_s=build_s)
        return MeasureResult.failure(inp.trial_id, inv, "no", build_s=build_s)

    def probe(self) -> bool:
        self.calls.append("probe")
        return False

    def close(self) -> None:
        self.calls.append("close")


def _value(name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def _inp(tid: str) -> MeasureInput:
    return MeasureInput(trial_id=tid, workload_key="k", workload_spec={"op": "matmul"},
                        target={"kind": "llvm"}, trace_json="[]")


def test_every_measurement_is_counted_and_timed() -> None:
    board = Board()
    m = metrics.Metered(board, "unit-board")
    for inv in Invalidity:  # every outcome is a series from the start (rate() needs a 0)
        assert _value("tunefarm_worker_measurements_total", device_key="unit-board",
                      invalidity=str(inv)) == 0
    assert _value("tunefarm_worker_build_seconds_count", device_key="unit-board") == 0
    m.prepare([_inp("a")])
    results = [m.measure_one(_inp(t)) for t in "abcd"]
    assert [r.invalidity for r in results] == [OUTCOMES[t][0] for t in "abcd"]
    for t in "abcd":
        assert _value("tunefarm_worker_measurements_total", device_key="unit-board",
                      invalidity=str(OUTCOMES[t][0])) == 1
    assert _value("tunefarm_worker_build_seconds_count", device_key="unit-board") == 2
    assert _value("tunefarm_worker_build_seconds_sum", device_key="unit-board") == \
        pytest.approx(0.5)
    # the board never ran the worker_lost and build_error ones: two runs, each at least the
    # board's 20 ms
    assert _value("tunefarm_worker_run_seconds_count", device_key="unit-board") == 2
    assert (_value("tunefarm_worker_run_seconds_sum", device_key="unit-board") or 0) >= 0.04
    assert m.probe() is False
    m.close()
    assert board.calls == ["prepare", "probe", "close"]


def test_the_client_counts_reclaimed_and_dead_lettered_entries() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/lease"):
            return httpx.Response(200, json={"entries": [
                {"entry_id": "1-0", "deliveries": 1, "input": {}},
                {"entry_id": "2-0", "deliveries": 3, "input": {}}]})
        body: dict[str, Any] = json.loads(request.content)
        return httpx.Response(200, json={"entry_ids": body["entry_ids"][:1]})

    client = metrics.MeteredClient("http://api.test", "tok", device_key="unit-client",
                                   transport=httpx.MockTransport(answer))
    assert _value("tunefarm_worker_reclaimed_entries_total", device_key="unit-client") == 0
    assert len(client.lease("w1", max_entries=2)) == 2
    assert _value("tunefarm_worker_reclaimed_entries_total", device_key="unit-client") == 1
    assert client.dead_letter("w1", ["2-0", "3-0"], "unreadable") == ["2-0"]
    assert _value("tunefarm_worker_dead_letters_total", device_key="unit-client") == 1
    client.close()
