"""The search loop end to end: real TVM builds, a real sandbox, a real database."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fakes import FlakyMeasurer
from tests.support.targets import RUN_X86
from tuner.db import JobState, Store
from tuner.interop.records import best_record
from tuner.measure import Invalidity, MeasureOptions
from tuner.measure.local import LocalMeasurer
from tuner.search import Progress, Tuner, TuneRequest
from tuner.search.history import trained_cost_model
from tuner.workloads import parse_spec

TARGET = RUN_X86
OPTS = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=2)

pytestmark = pytest.mark.slow


def _req(spec: dict[str, Any], trials: int, **kw: Any) -> TuneRequest:
    return TuneRequest(workload=parse_spec(spec), target=TARGET, trials=trials, batch_size=4,
                       options=OPTS, **kw)


def test_tune_stores_every_trial_and_resumes_without_remeasuring(store: Store) -> None:
    spec = {"op": "matmul", "shape": [64, 64, 64]}
    events: list[Progress] = []
    with LocalMeasurer() as m:
        tuner = Tuner(store, m, on_progress=events.append)
        first = tuner.run(_req(spec, 6))
        assert first.trials_done == 6 and first.measured_now == 6
        job = store.get_job(first.job_id)
        assert job is not None and job.state == JobState.SUCCEEDED
        rows = store.records(job_id=first.job_id)
        assert len(rows) == 6
        assert len({r.cand_hash for r in rows}) == 6
        assert all(r.features for r in rows)
        ok = [r for r in rows if r.invalidity is Invalidity.OK]
        assert ok and all(len(r.latencies) == 3 for r in ok)
        assert first.best_s == min(r.median_s for r in ok)
        assert [e.done for e in events if e.last is not None] == [1, 2, 3, 4, 5, 6]

        again = tuner.run(_req(spec, 6))  # same command: nothing to measure
        assert again.job_id == first.job_id and again.measured_now == 0
        assert store.count_records(job_id=first.job_id) == 6

        more = tuner.run(_req(spec, 10))  # a larger budget extends the same job
        assert more.job_id == first.job_id and more.measured_now == 4
        rows = store.records(job_id=first.job_id)
        assert len(rows) == 10 and len({r.cand_hash for r in rows}) == 10

        fresh = tuner.run(_req(spec, 3, fresh=True))  # a new job never re-measures a candidate
        assert fresh.job_id != first.job_id
        all_rows = store.records()
        assert len({r.cand_hash for r in all_rows}) == len(all_rows) == 13


def test_best_record_replays_to_the_measured_kernel(store: Store) -> None:
    import numpy as np

    from tuner.core import tvm_api as tv

    spec = {"op": "dense", "shape": [32, 48, 64]}
    with LocalMeasurer() as m:
        Tuner(store, m).run(_req(spec, 4))
    wl = parse_spec(spec)
    rec = best_record(store, wl, TARGET)
    assert rec["invalidity"] == "ok" and rec["latency_s"] > 0 and rec["gflops"] > 0
    sch = tv.apply_trace(wl.mod(), __import__("json").dumps(rec["trace"]))
    rt = tv.compile_module(sch.mod, tv.make_target(TARGET))
    inputs = wl.make_inputs(1)
    dev = tv.tvm.cpu(0)
    args = [tv.tvm.runtime.tensor(a, dev) for a in inputs]
    out = tv.tvm.runtime.empty(wl.arg_specs()[-1][1], "float32", dev)
    rt["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), wl.reference(inputs)[0], rtol=1e-4, atol=1e-4)


def test_best_record_passes_over_a_trace_that_no_longer_replays(store: Store) -> None:
    from sqlalchemy import update

    from tuner.core.errors import NotFound
    from tuner.db import tables as m

    spec = {"op": "matmul", "shape": [32, 32, 32]}
    with LocalMeasurer() as lm:
        Tuner(store, lm).run(_req(spec, 4))
    wl = parse_spec(spec)
    ranked = [r.trial_id for r in sorted(
        (r for r in store.records() if r.invalidity is Invalidity.OK), key=lambda r: r.median_s)]
    assert len(ranked) >= 2
    with store.session() as s:  # the fastest record's trace is one TVM cannot apply
        s.execute(update(m.Record).where(m.Record.trial_id == ranked[0]).values(trace_json="[]"))
    assert best_record(store, wl, TARGET)["trial_id"] == ranked[1]
    with store.session() as s:
        s.execute(update(m.Record).values(trace_json="[]"))
    with pytest.raises(NotFound, match="fastest records replays here"):
        best_record(store, wl, TARGET)


def test_cost_model_starts_from_the_targets_history(store: Store) -> None:
    """After a job, the farm's model of the target holds its records; a job on another
    workload of the target starts from that model."""
    from tuner.db import cost_models
    from tuner.search.costmodel import FEATURE_DIM

    with LocalMeasurer() as m:
        tuner = Tuner(store, m)
        s1 = tuner.run(_req({"op": "matmul", "shape": [32, 32, 32]}, 4))
        tref = store.target_by_key(s1.target_key)
        assert tref is not None
        rows = store.training_rows(tref.id)
        assert len(rows) == 4 and all(len(r[1]) == 4 * FEATURE_DIM for r in rows)
        stored = cost_models.latest(store, tref.id)
        assert stored is not None and stored.version == 1 and stored.rows == 4
        other = store.ensure_workload(key="other", op="tir", spec_json="{}", shash="0",
                                      mod_json="", description="", flops=1)
        model = trained_cost_model(store, tref, other, seed=0)
        assert model.trained and model.base is not None and model.size == 0


def test_infrastructure_failures_are_retried_and_never_counted(store: Store) -> None:
    spec = {"op": "matmul", "shape": [32, 32, 32]}
    with LocalMeasurer() as m:
        summary = Tuner(store, FlakyMeasurer(m)).run(_req(spec, 3))
    rows = store.records(job_id=summary.job_id)
    lost = [r for r in rows if r.invalidity is Invalidity.WORKER_LOST]
    real = [r for r in rows if r.invalidity is not Invalidity.WORKER_LOST]
    assert len(real) == 3 and len(lost) == 3 and summary.trials_done == 3
    assert len({r.trial_id for r in rows}) == 6  # a lost attempt never takes the trial's id
    tref = store.target_by_key(summary.target_key)
    assert tref is not None and len(store.training_rows(tref.id)) == 3


def test_a_dead_farm_fails_the_job_instead_of_spinning(store: Store) -> None:
    from tuner.core.errors import TunefarmError

    spec = {"op": "matmul", "shape": [16, 16, 16]}
    with LocalMeasurer() as m, pytest.raises(TunefarmError, match="worker_lost"):
        Tuner(store, FlakyMeasurer(m, always_lose=True)).run(_req(spec, 4))
    (job,) = [store.get_job(r.job_id) for r in store.records()[:1]]
    assert job is not None and job.state == JobState.FAILED


def test_an_unknown_space_creates_no_job(store: Store) -> None:
    from tuner.core.errors import SpecError

    with LocalMeasurer() as m, pytest.raises(SpecError, match="unknown space"):
        Tuner(store, m).run(_req({"op": "matmul", "shape": [16, 16, 16]}, 2, space="nope"))
    assert store.count_records() == 0


def test_the_first_batch_samples_the_space_while_the_model_knows_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """An untrained model scores at random, so the first batch is drawn from the space directly
    (no evolution); a model of other workloads only (the farm's) picks half of the first batch,
    random samples the rest; once the workload has records of its own, every batch comes from
    the model-guided evolutionary search."""
    from tuner.search import loop

    sampled: list[int] = []
    real = loop.sample_space
    monkeypatch.setattr(loop, "sample_space",
                        lambda s, a, n: sampled.append(n) or real(s, a, n))
    events: list[Progress] = []
    with LocalMeasurer() as m:
        tuner = Tuner(store, m, on_progress=events.append)
        first = tuner.run(_req({"op": "matmul", "shape": [32, 32, 32]}, 8))
        assert first.trials_done == 8 and sampled == [4]
        rows = store.records(job_id=first.job_id)
        assert len({r.cand_hash for r in rows}) == 8  # sampled, then evolved: no repeats
        second = tuner.run(_req({"op": "matmul", "shape": [48, 48, 48]}, 4))
        assert second.trials_done == 4 and sampled == [4, 4]  # the farm's model: half
        third = tuner.run(_req({"op": "matmul", "shape": [48, 48, 48]}, 8))  # resumed
        assert third.trials_done == 8 and sampled == [4, 4]  # its own rows: no sampling


def test_features_are_extracted_once_per_program() -> None:
    """The search scores survivors again in every generation and the loop asks for the features
    of the picks it measures: a program already seen (same structural hash) is not extracted
    again, and the rows come back in the candidates' order."""
    import numpy as np

    from schedules.registry import search_strategy, space_generator
    from tuner.core import tvm_api as tv
    from tuner.search.costmodel import FEATURE_DIM, XGBCostModel
    from tuner.search.loop import sample_space

    wl = parse_spec({"op": "matmul", "shape": [32, 32, 32]})
    target = tv.make_target(TARGET)
    mod = wl.mod()
    ctx = tv.tune_context(mod, target, space=space_generator("gemm-x86", wl, target),
                          strategy=search_strategy("gemm-x86"), seed=0, num_threads=1)
    model = XGBCostModel()
    ctx.search_strategy.pre_tuning(max_trials=8, num_trials_per_iter=8,
                                   design_spaces=ctx.generate_design_space(),
                                   database=tv.ms.database.MemoryDatabase(), cost_model=model)
    cands = sample_space(ctx.search_strategy, tv.ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
                         8)[:8]
    unique = {tv.structural_hash(c.sch.mod) for c in cands}

    inner = model._inst._extractor
    extracted: list[int] = []

    class Counting:
        def extract_from(self, context: Any, cs: list[Any]) -> Any:
            extracted.append(len(cs))
            return inner.extract_from(context, cs)

    model._inst._extractor = Counting()
    first = model.features(ctx, cands)
    again = model.features(ctx, cands[::-1])
    assert first.shape == (8, FEATURE_DIM) and np.array_equal(again, first[::-1])
    assert extracted == [len(unique)]
