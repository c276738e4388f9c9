"""What only the RPC measurer does (the scenarios every measurer shares are in
test_measurers.py): five timed steps on a board of the tracker, and the farm's failures (no
board for the key, a dead tracker, a board killed mid-run) as WORKER_LOST, never as kernel
failures. A real tracker and real RPC servers (tests/workers/conftest.py `rpc_farm`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.kernels import CRASH, HANG
from tests.support.measurer_contract import matmul_trace
from tests.support.rpcfarm import LOOPBACK_KEY as KEY
from tests.support.rpcfarm import LocalRpcFarm
from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.rpc import RpcMeasurer
from tuner.workloads import parse_spec

pytestmark = pytest.mark.timeout(120)

TARGET = RUN_X86
MATMUL = {"op": "matmul", "shape": [64, 64, 64]}


def _inp(spec: dict, trial: str, *, trace_json: str | None = None, verify: bool = True,
         run_timeout_s: float = 20.0) -> MeasureInput:
    wl = parse_spec(spec)
    if trace_json is None:
        trace_json = tv.trace_to_json(tv.Schedule(wl.mod()).trace)
    opts = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=1, verify=verify,
                          run_timeout_s=run_timeout_s, build_timeout_s=60)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec, target=TARGET,
                        trace_json=trace_json, options=opts)


@pytest.fixture(scope="module")
def farm(rpc_farm: LocalRpcFarm) -> LocalRpcFarm:
    return rpc_farm


@pytest.fixture(scope="module")
def measurer(farm: LocalRpcFarm) -> Iterator[RpcMeasurer]:
    with RpcMeasurer(*farm.tracker_address, KEY, request_timeout_s=30, build_workers=2) as m:
        yield m


def test_a_candidate_runs_in_five_timed_steps_on_a_board_of_the_key(
        farm: LocalRpcFarm, measurer: RpcMeasurer) -> None:
    res = measurer.measure_one(_inp(MATMUL, "r-steps",
                                    trace_json=matmul_trace(16, parallel=True)))
    assert res.invalidity is Invalidity.OK, res.error_msg
    assert set(measurer.last_steps) == {"session", "upload", "allocate", "run", "cleanup"}
    assert measurer.probe()
    board = (res.worker or "").rsplit("@", 1)[-1]
    assert board in {f"{s.host}:{s.port}" for s in farm.servers}


def test_no_board_for_the_key_is_worker_lost(farm: LocalRpcFarm) -> None:
    with RpcMeasurer(*farm.tracker_address, "no-such-board", request_timeout_s=1.5) as m:
        res = m.measure_one(_inp(MATMUL, "r-nobody"))
    assert res.invalidity is Invalidity.WORKER_LOST
    assert res.invalidity.is_infrastructure
    assert "no free board with key no-such-board" in (res.error_msg or "")
    assert not m.probe()


def test_a_dead_tracker_is_worker_lost() -> None:
    from tests.support.rpcfarm import free_port

    with RpcMeasurer("127.0.0.1", free_port(), KEY, request_timeout_s=2) as m:
        res = m.measure_one(_inp(MATMUL, "r-no-tracker"))
    assert res.invalidity is Invalidity.WORKER_LOST, res.error_msg


def test_a_board_killed_mid_run_is_worker_lost_and_the_next_goes_elsewhere(
        farm: LocalRpcFarm, measurer: RpcMeasurer) -> None:
    if len(farm.live_servers()) < 2:
        farm.add_server()
    killed: list[int] = []

    def kill_when_running(m: RpcMeasurer) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (m.step == "run" and m.board):
            time.sleep(0.05)
        if m.board:
            time.sleep(0.5)  # inside the endless kernel
            server = farm.server_at(m.board[1])
            assert server is not None
            server.kill()
            killed.append(server.port)

    killer = threading.Thread(target=kill_when_running, args=(measurer,), daemon=True)
    killer.start()
    lost = measurer.measure_one(_inp({"op": "tir", "tvmscript": HANG}, "r-hang", verify=False,
                                     run_timeout_s=60))
    killer.join(timeout=10)
    after = measurer.measure_one(_inp(MATMUL, "r-after"))
    assert killed, "the kernel never reached the run step"
    assert lost.invalidity is Invalidity.WORKER_LOST, (lost, after)
    assert after.invalidity is Invalidity.OK, (lost, after)
    assert not (after.worker or "").endswith(f":{killed[0]}")


def test_a_tir_reference_runs_in_a_sandboxed_process_not_in_the_worker(
        measurer: RpcMeasurer) -> None:
    """The reference of a `tir` workload is its submitted program, unscheduled: a program that
    dies of SIGFPE kills the build process computing it, not this process (the worker, which
    holds its token), and the candidate is a run_error naming the reference."""
    res = measurer.measure_one(_inp({"op": "tir", "tvmscript": CRASH}, "r-ref-crash"))
    assert res.invalidity is Invalidity.RUN_ERROR, res
    assert "reference" in (res.error_msg or ""), res.error_msg
    after = measurer.measure_one(_inp(MATMUL, "r-after-ref-crash"))
    assert after.invalidity is Invalidity.OK, after.error_msg
