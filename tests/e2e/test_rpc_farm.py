"""A board farm on loopback: a TVM RPC tracker and two RPC servers (the boards) started by the
test, RPC-mode workers, the API and a tuner. A job runs on both boards; a board killed in the
middle of a run costs a retry on the other board, recorded as an infrastructure failure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.farm import TARGET, Farm, running_farm
from tests.support.rpcfarm import FarmProcess, LocalRpcFarm
from tuner.db import Store
from tuner.measure import Invalidity

pytestmark = pytest.mark.slow
KEY = "board"


@pytest.fixture
def boards(tmp_path: Path) -> Iterator[LocalRpcFarm]:
    with LocalRpcFarm(KEY, servers=2, num_threads=1, log_dir=tmp_path / "rpc") as f:
        yield f


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path, TUNEFARM_LEASE_S="10") as f:
        yield f


def _rpc_worker(farm: Farm, boards: LocalRpcFarm, name: str) -> None:
    host, port = boards.tracker_address
    farm.start_worker(name, "--rpc-tracker", f"{host}:{port}", "--rpc-key", KEY, device_key=KEY)


def _run_job(farm: Farm, trials: int) -> str:
    job = farm.client().submit_job({"workload": {"op": "matmul", "shape": [64, 64, 64]},
                                    "target": TARGET, "device_key": KEY, "trials": trials,
                                    "batch_size": 4})
    return str(job["id"])


def _wait(cond: Any, timeout: float, farm: Farm, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{farm.logs()}")


def _records(pg_url: str, job_id: str) -> list[Any]:
    with Store(pg_url) as store:
        return store.records(job_id=job_id)


def _done(farm: Farm, job_id: str) -> dict[str, Any]:
    client = farm.client()
    return _wait(lambda: (j := client.get_job(job_id))["state"] in ("SUCCEEDED", "FAILED") and j,
                 240, farm, f"job {job_id}")


def _board(rec: Any) -> str:
    return str(rec.worker).rsplit("@", 1)[-1]


def test_job_runs_on_two_rpc_boards(farm: Farm, boards: LocalRpcFarm, pg_url: str) -> None:
    farm.start_tuner()
    _rpc_worker(farm, boards, "r1")
    _rpc_worker(farm, boards, "r2")
    job_id = _run_job(farm, trials=8)
    final = _done(farm, job_id)
    assert final["state"] == "SUCCEEDED" and final["trials_done"] == 8, final
    recs = _records(pg_url, job_id)
    assert len(recs) == 8 and all(r.invalidity is Invalidity.OK for r in recs), \
        [(r.invalidity, r.error_msg) for r in recs]
    assert len({r.cand_hash for r in recs}) == 8
    assert {_board(r) for r in recs} == {f"127.0.0.1:{s.port}" for s in boards.servers}


def _in_session(s: FarmProcess) -> bool:
    try:
        return len(psutil.Process(s.proc.pid).children(recursive=True)) > 1
    except psutil.NoSuchProcess:
        return False


def _busy_board(boards: LocalRpcFarm) -> FarmProcess | None:
    """The board serving a session now: its server forks a child per session. Seen in session
    three times 0.15 s apart (a run holds its board for over a second), so that a session child
    still exiting after its run (slow on a loaded machine) is not taken for a run."""
    for s in boards.live_servers():
        seen = 0
        while seen < 3 and _in_session(s):
            seen += 1
            time.sleep(0.15)
        if seen == 3:
            return s
    return None


def test_board_killed_mid_run_is_retried_on_the_other_board(farm: Farm, boards: LocalRpcFarm,
                                                            pg_url: str) -> None:
    farm.start_tuner(TUNEFARM_MIN_REPEAT_MS="300")  # every run holds its board >= 1 s
    _rpc_worker(farm, boards, "r1")
    job_id = _run_job(farm, trials=6)
    _wait(lambda: _records(pg_url, job_id), 180, farm, "the first record")
    victim = _wait(lambda: _busy_board(boards), 60, farm, "a board in a session")
    victim.kill()  # SIGKILL its process group in the middle of a run
    final = _done(farm, job_id)
    assert final["state"] == "SUCCEEDED" and final["trials_done"] == 6, final
    recs = _records(pg_url, job_id)
    lost = [r for r in recs if r.invalidity is Invalidity.WORKER_LOST]
    measured = [r for r in recs if r.invalidity is not Invalidity.WORKER_LOST]
    assert lost and all(_board(r) == f"127.0.0.1:{victim.port}" for r in lost), \
        [(r.invalidity, r.worker, r.error_msg) for r in recs]
    assert all(r.invalidity is Invalidity.OK for r in measured)  # never a slow or broken kernel
    assert len(measured) == 6 and len({r.cand_hash for r in measured}) == 6
    survivor = f"127.0.0.1:{next(s.port for s in boards.servers if s is not victim)}"
    for r in lost:  # the same candidate, measured again on the other board
        again = [m for m in measured if m.cand_hash == r.cand_hash]
        assert again and _board(again[0]) == survivor
    assert all("-lost-" in r.trial_id and r.features is not None for r in lost)
