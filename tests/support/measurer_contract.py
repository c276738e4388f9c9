"""The contract every `tuner.measure.Measurer` keeps, written once (like Optuna's
`StorageTestCase`) and run over each way of measuring:

    local   tuner.measure.local.LocalMeasurer: this machine, a sandbox process
    rpc     tuner.measure.rpc.RpcMeasurer: boards behind a local TVM RPC tracker (`rpcfarm`)
    remote  tuner.measure.remote.RemoteMeasurer: real Redis and a SQLite store, measured by a
            `FakeWorker` thread that measures each entry with a real LocalMeasurer and commits
            its record the way the API does

A test module subclasses `MeasurerContract` and provides a module-scoped `backend` fixture
parametrized over `KINDS`, built with `supply(kind, request)`. Real kernels, real builds, small
shapes; one measurer per backend serves every scenario (a scenario that breaks a kernel checks
that the measurer keeps working). Where a backend differs, `Backend` says so (a record carries
no `max_abs_err`; a TVM RPC server whose session crashed stops serving) and the scenario adapts.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tests.kernels import CRASH, HANG
from tests.support.rpcfarm import LOOPBACK_KEY as RPC_KEY
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions, Measurer
from tuner.workloads import parse_spec

KINDS = ["local", "rpc", "remote"]
TARGET = tv.host_target_dict(num_cores=2)  # the kernels run here: this CPU, made explicit
MATMUL = {"op": "matmul", "shape": [64, 64, 64]}
DENSE = {"op": "dense", "shape": [16, 32, 24]}  # gemm-x86 packs its weights
RUN_TIMEOUT_S = 2.0  # of the hanging kernel


@dataclass
class Backend:
    """A measurer under test and what the scenarios need to know about it."""

    kind: str
    measurer: Measurer
    reports_max_abs_err: bool = True  # False: the result comes back from a stored record
    survives_crash: bool = True  # False: a crashed kernel takes its board out of service
    context: dict[str, Any] | None = None  # record context each input carries (remote)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the RPC farm

    def input(self, spec: dict[str, Any], trial: str, *, trace_json: str | None = None,
              verify: bool = True, run_timeout_s: float = 20.0,
              build_timeout_s: float = 60.0) -> MeasureInput:
        """A candidate of `spec` (default: its unscheduled program) under trial id `trial`."""
        wl = parse_spec(spec)
        if trace_json is None:
            trace_json = tv.trace_to_json(tv.Schedule(wl.mod()).trace)
        opts = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=1, verify=verify,
                              run_timeout_s=run_timeout_s, build_timeout_s=build_timeout_s)
        ctx = None if self.context is None else {**self.context, "cand_hash": trial}
        return MeasureInput(trial_id=f"{self.kind}-{trial}", workload_key=wl.key,
                            workload_spec=wl.spec, target=TARGET, trace_json=trace_json,
                            options=opts, context=ctx)


# ---------------------------------------------------------------------------------- traces
def matmul_trace(split: int, *, parallel: bool) -> str:
    """The matmul with its j loop split by `split` and vectorized (i parallel)."""
    sch = tv.Schedule(parse_spec(MATMUL).mod())
    blk = sch.get_child_blocks(sch.get_sblock("root"))[0]
    i, j, _ = sch.get_loops(blk)
    _, ji = sch.split(j, [None, split])
    sch.vectorize(ji)
    if parallel:
        sch.parallel(i)
    return tv.trace_to_json(sch.trace)


def wrong_matmul_trace() -> str:
    """The matmul accumulating in an int32 buffer (`unsafe_set_dtype`): every partial sum is
    truncated, so the outputs are wrong by whole units."""
    sch = tv.Schedule(parse_spec(MATMUL).mod())
    blk = sch.get_sblock("C")
    sch.cache_write(blk, 0, "global")
    sch.unsafe_set_dtype(blk, 0, "int32")
    return tv.trace_to_json(sch.trace)


def packed_dense_trace() -> str:
    """A gemm-x86 point of the dense: its kernel takes the weights pre-packed."""
    from schedules.registry import TEMPLATES

    wl = parse_spec(DENSE)
    sch = TEMPLATES["gemm-x86"].apply(tv.Schedule(wl.mod(), seed=3), wl, tv.make_target(TARGET))[0]
    return tv.trace_to_json(sch.trace)


# ---------------------------------------------------------------------------------- suppliers
def supply(kind: str, request: pytest.FixtureRequest) -> contextlib.AbstractContextManager[Backend]:
    """The backend of `kind`, as a context manager that releases it. `rpc` uses the `rpc_farm`
    fixture; `remote` the `redis_url` fixture."""
    if kind == "local":
        return _local()
    if kind == "rpc":
        return _rpc(request.getfixturevalue("rpc_farm"))
    if kind == "remote":
        return _remote(request.getfixturevalue("redis_url"))
    raise ValueError(f"unknown measurer kind {kind!r}")


@contextlib.contextmanager
def _local() -> Iterator[Backend]:
    from tuner.measure.local import LocalMeasurer

    with LocalMeasurer() as m:
        yield Backend("local", m)


@contextlib.contextmanager
def _rpc(farm: Any) -> Iterator[Backend]:
    from tuner.measure.rpc import RpcMeasurer

    # the server ends a session after 15 s: a board wedged by a hanging kernel comes back
    with RpcMeasurer(*farm.tracker_address, RPC_KEY, request_timeout_s=30, session_timeout_s=15,
                     build_workers=2) as m:
        yield Backend("rpc", m, survives_crash=False, extra={"farm": farm})


@contextlib.contextmanager
def _remote(redis_url: str) -> Iterator[Backend]:
    from tests.support.fakefarm import FakeWorker, make_job
    from tuner.db import Store
    from tuner.measure.local import LocalMeasurer
    from tuner.measure.remote import RemoteMeasurer
    from tuner.queue import Keys, streams

    prefix = f"tunefarm-test-{uuid.uuid4().hex[:12]}:"
    keys = Keys(prefix)
    r = streams.connect(redis_url)
    with tempfile.TemporaryDirectory(prefix="tunefarm-contract-") as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'tunefarm.db'}")
        job = make_job(store, trials=100)
        context = {"job_id": job.id, "workload_id": job.workload_id, "target_id": job.target_id,
                   "space": "default", "decisions": [], "features_b64": None,
                   "tvm_version": "test"}
        try:
            with LocalMeasurer() as engine, FakeWorker(redis_url, keys, store, measurer=engine):
                m = RemoteMeasurer(r, keys, "dev", store=store, queue_wait_s=120, lease_s=30,
                                   poll_s=0.05)
                with m:
                    yield Backend("remote", m, reports_max_abs_err=False, context=context)
        finally:
            store.close()
            stale = list(r.scan_iter(match=f"{prefix}*", count=1000))
            if stale:
                r.delete(*stale)
            r.close()


# ---------------------------------------------------------------------------------- contract
class MeasurerContract:
    """The scenarios; a subclass runs them with its `backend` fixture."""

    def test_a_good_kernel_is_verified_and_timed(self, backend: Backend) -> None:
        """Prepared or not, a correct kernel comes back OK: verified, timed `repeats` times."""
        m = backend.measurer
        inputs = [backend.input(MATMUL, "ok-8", trace_json=matmul_trace(8, parallel=False)),
                  backend.input(MATMUL, "ok-16", trace_json=matmul_trace(16, parallel=True)),
                  backend.input(MATMUL, "ok-plain")]
        m.prepare(inputs[:2])  # the third is measured without being prepared
        results = [m.measure_one(i) for i in inputs]
        assert m.probe()
        for inp, res in zip(inputs, results, strict=True):
            assert res.invalidity is Invalidity.OK, res.error_msg
            assert res.trial_id == inp.trial_id
            assert len(res.latencies_s) == 3 and all(x > 0 for x in res.latencies_s)
            assert res.median_s is not None and res.cv is not None
            assert res.worker and res.build_s and res.build_s > 0
            if backend.reports_max_abs_err:
                assert res.max_abs_err is not None and res.max_abs_err < 1e-3

    def test_a_trace_that_does_not_apply_is_a_build_error(self, backend: Backend) -> None:
        bad = backend.input({"op": "softmax", "shape": [4, 8]}, "bad-trace",
                            trace_json=matmul_trace(8, parallel=False))
        res = backend.measurer.measure_one(bad)
        assert res.invalidity is Invalidity.BUILD_ERROR and res.error_msg
        assert res.trial_id == bad.trial_id

    def test_a_hanging_kernel_is_a_run_timeout_and_the_measurer_keeps_working(
            self, backend: Backend) -> None:
        m = backend.measurer
        res = m.measure_one(backend.input({"op": "tir", "tvmscript": HANG}, "hang",
                                          verify=False, run_timeout_s=RUN_TIMEOUT_S))
        assert res.invalidity is Invalidity.RUN_TIMEOUT, res.error_msg
        assert f"{RUN_TIMEOUT_S:g} s" in (res.error_msg or "")
        after = m.measure_one(backend.input(MATMUL, "after-hang"))
        assert after.invalidity is Invalidity.OK, after.error_msg

    def test_a_crashing_kernel_is_a_run_error_and_the_measurer_keeps_working(
            self, backend: Backend) -> None:
        if not backend.survives_crash:
            pytest.skip(f"{backend.kind}: TVM's rpc_server stops serving (and leaves the "
                        "tracker) when a kernel crashes its session: the board is lost")
        m = backend.measurer
        restarts = getattr(m, "restarts", 0)
        res = m.measure_one(backend.input({"op": "tir", "tvmscript": CRASH}, "crash",
                                          verify=False))
        assert res.invalidity is Invalidity.RUN_ERROR, res.error_msg
        assert "SIGFPE" in (res.error_msg or "")  # the sandbox names the signal
        if backend.kind == "local":
            assert m.restarts == restarts + 1  # type: ignore[attr-defined]
        after = m.measure_one(backend.input(MATMUL, "after-crash"))
        assert after.invalidity is Invalidity.OK, after.error_msg

    def test_wrong_outputs_are_a_wrong_answer(self, backend: Backend) -> None:
        res = backend.measurer.measure_one(
            backend.input(MATMUL, "wrong", trace_json=wrong_matmul_trace()))
        assert res.invalidity is Invalidity.WRONG_ANSWER, res.error_msg
        assert not res.latencies_s
        if backend.reports_max_abs_err:
            assert res.max_abs_err is not None and res.max_abs_err > 0.5

    def test_packed_weights_are_verified_when_they_could_be_best(self, backend: Backend) -> None:
        """A kernel timed on pre-packed weights needs a second build (with the packing) to be
        verified: done when it could be the best (faster than `verify_below_s`, or no best
        yet), skipped for the others."""
        m = backend.measurer
        base = backend.input(DENSE, "packed", trace_json=packed_dense_trace())

        def below(trial: str, seconds: float | None) -> MeasureInput:
            return replace(base, trial_id=f"{base.trial_id}-{trial}",
                           options=replace(base.options, verify_below_s=seconds))

        first = m.measure_one(base)  # no best yet
        slower = m.measure_one(below("slower", 1e-12))
        faster = m.measure_one(below("faster", 10.0))
        for res in (first, slower, faster):
            assert res.ok and len(res.latencies_s) == 3, res.error_msg
        if backend.reports_max_abs_err:
            assert first.max_abs_err is not None and first.max_abs_err < 1e-3
            assert slower.max_abs_err is None
            assert faster.max_abs_err is not None and faster.max_abs_err < 1e-3

    # its repeat counts follow measured latencies against thresholds: timed alone, after the
    # parallel run (a test on the other core made the "between" kernel look far slower once)
    @pytest.mark.solo
    def test_a_kernel_far_slower_than_the_best_is_timed_once(self, backend: Backend) -> None:
        """With a best to beat and a prune factor, a kernel whose first repeat is slower than
        best x factor gets no more repeats; one within it gets all of them."""
        m = backend.measurer
        base = backend.input(MATMUL, "prune", trace_json=matmul_trace(8, parallel=False))

        def against(trial: str, best_s: float) -> MeasureInput:
            return replace(base, trial_id=f"{base.trial_id}-{trial}",
                           options=replace(base.options, verify_below_s=best_s, prune_factor=1.5))

        far = m.measure_one(against("far", 1e-9))
        near = m.measure_one(against("near", 10.0))
        assert far.ok and len(far.latencies_s) == 1 and far.latencies_s[0] > 1.5e-9, far.error_msg
        assert near.ok and len(near.latencies_s) == 3, near.error_msg
        # past best x confirm_factor by far, with no limit on the first repeat: two repeats
        assert near.median_s is not None
        between = m.measure_one(replace(
            base, trial_id=f"{base.trial_id}-between",
            options=replace(base.options, verify_below_s=near.median_s / 2, prune_factor=0.0,
                            confirm_factor=1.1)))
        assert between.ok and len(between.latencies_s) == 2, between.error_msg
        # slower than the best but within the prune limit: once two of its three repeats read
        # slower, its median could not win, and the third is not timed. The best is half of
        # `near` (not just under it), so that a run of this kernel faster than `near` read on a
        # noisy machine still reads slower than the best. Repeats of 20 ms: the race stops
        # early only where a repeat is many calls, and a first call that took 2 ms (over RPC on
        # a loaded host, CI saw it) made each repeat one call
        close = m.measure_one(replace(
            base, trial_id=f"{base.trial_id}-close",
            options=replace(base.options, verify_below_s=near.median_s / 2, prune_factor=4.0,
                            confirm_factor=0.0, min_repeat_ms=20)))
        assert close.ok and 1 <= len(close.latencies_s) < 3, close.error_msg
