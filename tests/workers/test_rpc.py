"""RPC measurement on loopback: a real tracker and real RPC servers (own process groups, killed
in teardown), real builds. Boards that die or never show up are WORKER_LOST, not kernel failures."""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.kernels import HANG, HEADER
from tuner import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.workloads import parse_spec
from workers.rpc import RpcMeasurer
from workers.rpcfarm import LocalRpcFarm

pytestmark = pytest.mark.timeout(120)

KEY = "loopback"
TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
MATMUL = {"op": "matmul", "shape": [64, 64, 64]}

# the matmul's signature, but C starts at 1: wrong by one everywhere
OFF_BY_ONE = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"),
             C: T.Buffer((64, 64), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, k in T.grid(64, 64, 64):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(1)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
    ''')


def _inp(spec: dict, trial: str, *, trace_json: str | None = None, verify: bool = True,
         run_timeout_s: float = 20.0) -> MeasureInput:
    wl = parse_spec(spec)
    if trace_json is None:
        trace_json = tv.trace_to_json(tv.Schedule(wl.mod()).trace)
    opts = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=1, verify=verify,
                          run_timeout_s=run_timeout_s, build_timeout_s=60)
    return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec, target=TARGET,
                        trace_json=trace_json, options=opts)


def _matmul_trace(split: int, *, parallel: bool) -> str:
    sch = tv.Schedule(parse_spec(MATMUL).mod())
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    i, j, _ = sch.get_loops(blk)
    _, ji = sch.split(j, [None, split])
    sch.vectorize(ji)
    if parallel:
        sch.parallel(i)
    return tv.trace_to_json(sch.trace)


@pytest.fixture(scope="module")
def farm() -> Iterator[LocalRpcFarm]:
    with LocalRpcFarm(KEY, servers=2, num_threads=1) as f:
        yield f


@pytest.fixture(scope="module")
def measurer(farm: LocalRpcFarm) -> Iterator[RpcMeasurer]:
    with RpcMeasurer(*farm.tracker_address, KEY, request_timeout_s=30, build_workers=2) as m:
        yield m


def test_candidates_are_verified_and_timed_on_the_boards(farm: LocalRpcFarm,
                                                         measurer: RpcMeasurer) -> None:
    inputs = [_inp(MATMUL, "r-8", trace_json=_matmul_trace(8, parallel=False)),
              _inp(MATMUL, "r-16", trace_json=_matmul_trace(16, parallel=True)),
              _inp(MATMUL, "r-plain")]
    measurer.prepare(inputs[:2])  # built in parallel; the third is built when measured
    results = [measurer.measure_one(i) for i in inputs]
    assert set(measurer.last_steps) == {"session", "upload", "allocate", "run", "cleanup"}
    assert measurer.probe()
    for res in results:
        assert res.invalidity is Invalidity.OK, res.error_msg
        assert len(res.latencies_s) == 3 and all(x > 0 for x in res.latencies_s)
        assert res.max_abs_err is not None and res.max_abs_err < 1e-3
        assert res.build_s and res.build_s > 0
        board = (res.worker or "").rsplit("@", 1)[-1]
        assert board in {f"{s.host}:{s.port}" for s in farm.servers}


def test_wrong_outputs_are_a_wrong_answer(measurer: RpcMeasurer) -> None:
    # the library built for the off-by-one function, measured as the matmul's candidate
    measurer.prepare([_inp({"op": "tir", "tvmscript": OFF_BY_ONE}, "r-wrong")])
    res = measurer.measure_one(_inp(MATMUL, "r-wrong"))
    assert res.invalidity is Invalidity.WRONG_ANSWER, res.error_msg
    assert res.max_abs_err is not None and res.max_abs_err > 0.5
    assert not res.latencies_s


def test_a_trace_that_does_not_apply_is_a_build_error(measurer: RpcMeasurer) -> None:
    bad = _inp({"op": "softmax", "shape": [4, 8]}, "r-bad",
               trace_json=_matmul_trace(8, parallel=False))
    res = measurer.measure_one(bad)
    assert res.invalidity is Invalidity.BUILD_ERROR and res.error_msg


def test_packed_weights_are_verified_through_the_whole_program(measurer: RpcMeasurer) -> None:
    """Timed as the kernel on pre-packed weights; verified (a second build, with the packing)
    only when it could be the best."""
    from schedules.registry import TEMPLATES, _load

    _load()
    spec = {"op": "dense", "shape": [16, 32, 24]}
    wl = parse_spec(spec)
    sch = TEMPLATES["gemm-x86"].apply(tv.Schedule(wl.mod(), seed=3), wl, tv.make_target(TARGET))[0]
    base = _inp(spec, "r-packed", trace_json=tv.trace_to_json(sch.trace))
    slower = measurer.measure_one(replace(base, trial_id="r-slower",
                                          options=replace(base.options, verify_below_s=1e-12)))
    faster = measurer.measure_one(replace(base, trial_id="r-faster",
                                          options=replace(base.options, verify_below_s=10.0)))
    assert slower.ok and slower.max_abs_err is None and len(slower.latencies_s) == 3
    assert faster.ok and faster.max_abs_err is not None and faster.max_abs_err < 1e-3


def test_a_hanging_kernel_is_a_run_timeout(farm: LocalRpcFarm) -> None:
    hang = _inp({"op": "tir", "tvmscript": HANG}, "r-timeout", verify=False, run_timeout_s=2)
    # the server ends the abandoned session after 5 s, which frees the board
    with RpcMeasurer(*farm.tracker_address, KEY, request_timeout_s=30, session_timeout_s=5) as m:
        res = m.measure_one(hang)
    assert res.invalidity is Invalidity.RUN_TIMEOUT, res.error_msg
    assert "2 s" in (res.error_msg or "")


def test_no_board_for_the_key_is_worker_lost(farm: LocalRpcFarm) -> None:
    with RpcMeasurer(*farm.tracker_address, "no-such-board", request_timeout_s=1.5) as m:
        res = m.measure_one(_inp(MATMUL, "r-nobody"))
    assert res.invalidity is Invalidity.WORKER_LOST
    assert res.invalidity.is_infrastructure
    assert "no free board with key no-such-board" in (res.error_msg or "")
    assert not m.probe()


def test_a_dead_tracker_is_worker_lost() -> None:
    from workers.rpcfarm import free_port

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
