"""`python -m bench.search` replays a recording: a search run with synthetic measurements is
recorded in one database, then replayed by seed in throw-away databases, measuring nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import search as bench_search
from tests.support.search import Synthetic, small_search
from tuner.core import tvm_api as tv
from tuner.core.config import get_settings
from tuner.db import Store
from tuner.measure import MeasureOptions
from tuner.measure.replay import ReplayMeasurer
from tuner.search import Tuner, TuneRequest
from tuner.workloads import parse_spec

SPEC = {"op": "matmul", "shape": [16, 32, 24]}
TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def test_a_recorded_search_replays_without_measuring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    small_search(monkeypatch)
    # recorded in batches of the size `bench.search` replays with (the settings'): a search
    # replayed in other batches proposes other candidates (batches of 4 recorded, 16 replayed:
    # the replay's first batch was sometimes not all in the recording)
    url = f"sqlite:///{tmp_path / 'recording.db'}"
    store = Store(url)
    try:
        req = TuneRequest(workload=parse_spec(SPEC), target=tv.target_to_dict(
            tv.make_target(TARGET)), trials=24, batch_size=get_settings().batch_size, seed=0,
            options=MeasureOptions(num_threads=1))
        recorded = Tuner(store, ReplayMeasurer(fallback=Synthetic())).run(req)
    finally:
        store.close()
    assert recorded.trials_done == 24

    rc = bench_search.main(["--workload", json.dumps(SPEC), "--db", url, "--target",
                            json.dumps(TARGET), "--trials", "8", "--seeds", "0",
                            "--fallback", "none"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "recording: 24 candidates" in out
    row = next(line for line in out.splitlines() if line.startswith("| 0 |"))
    seed, trials, replayed, measured = (c.strip() for c in row.split("|")[1:5])
    assert int(trials) >= 1 and int(replayed) == int(trials) and measured == "0", out
    assert bench_search.main(["--workload", json.dumps({**SPEC, "shape": [8, 8, 8]}), "--db", url,
                              "--target", json.dumps(TARGET)]) == 2  # nothing recorded
