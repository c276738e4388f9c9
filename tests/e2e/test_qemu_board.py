"""The emulated aarch64 board (workers/board.py): TVM's own RPC server as an aarch64 process
under qemu-user in an arm64 Debian root, registered with a real tracker. The Arm templates are
tuned through it from the CLI (every candidate built here for aarch64, linked and verified on the
board), a farm job runs on it through the API, a tuner and an RPC worker, and a board killed in
the middle of a run costs a `worker_lost` and a retry on the other board.

Needs root (chroot) and the board's root (`tunefarm board build`; `.ci/run` builds it once per
machine into TUNEFARM_BOARD_DIR): skipped without them, failed under CI=true."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.farm import Farm, running_farm
from tests.e2e.test_rpc_farm import _board, _busy_board, _done, _records, _wait
from tests.support.rpcfarm import LocalRpcFarm
from tuner.core.config import get_settings
from tuner.measure import Invalidity
from workers import board

pytestmark = pytest.mark.slow
KEY = board.KEY
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
I8MM = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod", "+i8mm"]}
DIR = board.board_dir(get_settings().data_dir)


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "the emulated board runs in a chroot: needs root"
    if not board.is_built(DIR):
        return f"the board's root is not built in {DIR}: tunefarm board build"
    return None


@pytest.fixture(scope="module")
def boards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRpcFarm]:
    """A tracker and two emulated boards, as a LocalRpcFarm (its servers are the boards)."""
    if (why := _problem()) is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; CI=true requires the emulated board", pytrace=False)
        pytest.skip(why)
    logs = tmp_path_factory.mktemp("qemu-board")

    def emulated(tracker: tuple[str, int], port: int, log_dir: Path) -> Any:
        return board.start_server(DIR / "root", tracker, port, log_dir / f"board-{port}.log")

    with LocalRpcFarm(KEY, servers=2, log_dir=logs, timeout_s=board.START_TIMEOUT_S,
                      server=emulated) as farm:
        yield farm


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], env=env, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.mark.parametrize(("op", "target", "space"), [
    ("dense", NEON, "dense-neon-aarch64"), ("dense_int8", I8MM, "dense-int8-sdot-aarch64")])
def test_the_cli_tunes_an_arm_template_on_the_emulated_board(
        boards: LocalRpcFarm, tmp_path: Path, op: str, target: dict[str, Any],
        space: str) -> None:
    """The issue's command, as a user types it: 16 records measured and verified on the board
    (a wrong output would be wrong_answer), marked emulated."""
    host, port = boards.tracker_address
    env = {**os.environ, "TUNEFARM_DATA_DIR": str(tmp_path),
           "TUNEFARM_DATABASE_URL": f"sqlite:///{tmp_path / 't.db'}", "TVM_NUM_THREADS": "1"}
    tuned = _cli("tune", op, "--shape", "64,256,128", "--target", json.dumps(target),
                 "--device-key", KEY, "--rpc-tracker", f"{host}:{port}", "--trials", "16",
                 "--json", env=env)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    summary = json.loads(tuned.stdout)
    assert summary["outcomes"] == {"ok": 16}, summary
    assert "emulated board" in tuned.stderr
    listed = _cli("records", op, "--shape", "64,256,128", "--json", "--limit", "50", env=env)
    recs = json.loads(listed.stdout)
    assert len(recs) == 16 and all(r["invalidity"] == "ok" and r["emulated"] for r in recs)
    assert {r["space"] for r in recs} == {space}
    assert {r["worker"].rsplit("@", 1)[-1] for r in recs} <= {
        f"127.0.0.1:{s.port}" for s in boards.servers}
    best = _cli("best", op, "--shape", "64,256,128", "--target", json.dumps(target),
                "--device-key", KEY, env=env)
    assert best.returncode == 0 and "emulated board" in best.stdout, best.stdout + best.stderr


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path, TUNEFARM_LEASE_S="30") as f:
        yield f


def _job(farm: Farm, trials: int) -> str:
    job = farm.client().submit_job({"workload": {"op": "dense", "shape": [32, 64, 48]},
                                    "target": NEON, "device_key": KEY, "trials": trials,
                                    "batch_size": 4})
    return str(job["id"])


def test_a_farm_job_runs_on_emulated_boards_and_survives_losing_one(
        boards: LocalRpcFarm, farm: Farm, pg_url: str) -> None:
    """API + tuner + an RPC worker of key qemu-aarch64: the job succeeds with every candidate
    verified on the boards; a board killed while it runs a candidate is a worker_lost, and
    that candidate is measured again on the other board. (Last in this file: it kills a board.)"""
    host, port = boards.tracker_address
    farm.start_tuner(TUNEFARM_MIN_REPEAT_MS="300")  # every run holds its board for a while
    farm.start_worker("arm", "--rpc-tracker", f"{host}:{port}", device_key=KEY, target=NEON)
    job_id = _job(farm, trials=8)
    _wait(lambda: _records(pg_url, job_id), 300, farm, "the first record")
    victim = _wait(lambda: _busy_board(boards), 120, farm, "a board in a session")
    victim.kill()
    final = _done(farm, job_id)
    assert final["state"] == "SUCCEEDED" and final["trials_done"] == 8, final
    assert final["emulated"] is True
    recs = _records(pg_url, job_id)
    lost = [r for r in recs if r.invalidity is Invalidity.WORKER_LOST]
    measured = [r for r in recs if r.invalidity is not Invalidity.WORKER_LOST]
    assert all(r.invalidity is Invalidity.OK for r in measured), \
        [(r.invalidity, r.error_msg) for r in measured]
    assert len(measured) == 8 and len({r.cand_hash for r in measured}) == 8
    assert lost and all(_board(r) == f"127.0.0.1:{victim.port}" for r in lost), \
        [(r.invalidity, r.worker, r.error_msg) for r in recs]
    survivor = f"127.0.0.1:{next(s.port for s in boards.servers if s is not victim)}"
    for r in lost:  # the same candidate, measured again on the other board
        again = [m for m in measured if m.cand_hash == r.cand_hash]
        assert again and _board(again[0]) == survivor
