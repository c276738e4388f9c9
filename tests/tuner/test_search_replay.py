"""The search loop over every space of the registry, without hardware: `Tuner.run` with a
`ReplayMeasurer` whose fallback makes up a deterministic result per candidate (Kernel Tuner's
simulation mode). Real design spaces, real evolutionary search, real cost model, real SQL; no
build, no timing. The budget, the records, dedup, resuming and the best are checked per space.

The search is shrunk (`tests.support.search.small_search`): the loop is under test here, not
MetaSchedule's search quality; `test_search.py` runs the full one with real measurements."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import fused as relax_tasks
from schedules import registry
from tests.support.search import Synthetic, small_search
from tuner.core import tvm_api as tv
from tuner.core.errors import JobHandedOff
from tuner.db import JobState, NewRecord, Store
from tuner.db.jobs import list_jobs
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.replay import NotRecorded, ReplayMeasurer
from tuner.search import Progress, Tuner, TuneRequest
from tuner.workloads import parse_spec

X86 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
N1 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1",
      "mattr": ["+neon", "+dotprod"], "num-cores": 4}
N1_I8MM = {**N1, "mattr": ["+neon", "+dotprod", "+i8mm"]}
SM80 = {"kind": "cuda", "arch": "sm_80", "host": {"kind": "llvm"}}
AVX2 = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}  # no VNNI: dense-int8-avx2
SPR = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}  # AMX: dense-*-amx
TARGETS = [X86, N1, N1_I8MM, SM80, AVX2, SPR]  # tried in this order: the first a space applies to

# small workloads; each space is tried on the first that it applies to (on the first target)
SPECS: list[dict[str, Any]] = [
    {"op": "matmul", "shape": [16, 32, 24]},
    {"op": "dense", "shape": [16, 32, 24]},
    {"op": "batch_matmul", "shape": [2, 8, 32, 16]},
    {"op": "dense", "shape": [64, 64, 32], "dtype": "float16"},
    {"op": "dense", "shape": [16, 32, 24], "dtype": "bfloat16"},  # dense-bf16-avx512
    {"op": "dense_int8", "shape": [8, 32, 64]},
    {"op": "softmax", "shape": [8, 64]},
    {"op": "conv2d", "shape": [1, 16, 10, 10, 32, 3, 3], "padding": 1},
    {"op": "conv2d", "shape": [1, 16, 10, 10, 32, 3, 3], "padding": 1, "layout": "NHWC"},
    {"op": "depthwise_conv2d", "shape": [1, 16, 12, 12, 3, 3], "padding": 1},
    # relax's GELU between two reshapes (activation-x86)
    {"op": "tir", "tvmscript": relax_tasks.activation((2, 3072), "gelu").script()},
    # relax's layer norm (norm-x86: 15 points, the test measures 12)
    {"op": "tir", "tvmscript": relax_tasks.norm((16, 64), "layer_norm").script()},
    {"op": "dense", "shape": [64, 64, 64], "dtype": "bfloat16"},  # dense-bf16-amx
    {"op": "dense_int8", "shape": [64, 64, 128]},  # dense-int8-amx
]
SPACES = [n for n in registry.space_names() if n != "default"]  # every template, and "auto"
OPTS = MeasureOptions(num_threads=1)


def case_for(space: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec, target) of the first small workload and target `space` applies to."""
    for spec in SPECS:
        wl = parse_spec(spec)
        for target in TARGETS:
            if space in registry.spaces_for(wl, tv.make_target(target)):
                return spec, target
    raise AssertionError(f"no small workload for space {space!r}: add one to SPECS")


@pytest.fixture(scope="module", autouse=True)
def _tvm_setup() -> None:
    """TVM's CUDA tensor intrinsics (~8 s to import, once per process; dense-wmma-cuda needs
    them): paid here, not inside one space's test."""
    tv.load_tensor_intrins("cuda")


@pytest.fixture(autouse=True)
def _small_search(monkeypatch: pytest.MonkeyPatch) -> None:
    small_search(monkeypatch)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    """A SQLite store with a spy: `db.written` lists the trial id of every record written.
    (The loop's SQL runs on both backends in test_search.py and the store's own suites.)"""
    store = Store(f"sqlite:///{tmp_path / 'tunefarm.db'}")
    written: list[str] = []
    add = store.add_records

    def spy(records: Any) -> int:
        written.extend(r.trial_id for r in records)
        return add(records)

    store.add_records = spy  # type: ignore[method-assign]
    store.written = written  # type: ignore[attr-defined]
    try:
        yield store
    finally:
        store.close()


def _req(spec: dict[str, Any], target: dict[str, Any], space: str, trials: int,
         **kw: Any) -> TuneRequest:
    return TuneRequest(workload=parse_spec(spec), target=target, trials=trials, batch_size=4,
                       space=space, options=OPTS, **kw)


@pytest.mark.parametrize("space", SPACES)
def test_the_search_over_every_space(db: Store, space: str) -> None:
    spec, target = case_for(space)
    synthetic = Synthetic(lose_first=True)
    replay = ReplayMeasurer(fallback=synthetic)
    events: list[Progress] = []
    tuner = Tuner(db, replay, on_progress=events.append)

    first = tuner.run(_req(spec, target, space, 8))
    assert first.trials_done == first.measured_now == 8, first.stop_reason
    assert first.stop_reason == "budget reached"
    job = db.get_job(first.job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.space == space
    assert [e.done for e in events if e.last is not None] == list(range(1, 9))
    rows = db.records(job_id=first.job_id)
    real = [r for r in rows if r.invalidity is not Invalidity.WORKER_LOST]
    lost = [r for r in rows if r.invalidity is Invalidity.WORKER_LOST]
    # the budget counts measurements; each trial is committed once, as the replay answered it
    assert len(real) == 8 and {r.trial_id for r in real} == set(replay.answered)
    assert all(n == 1 for n in Counter(db.written).values())  # type: ignore[attr-defined]
    for r in real:
        answer = replay.answered[r.trial_id]
        assert r.invalidity is answer.invalidity and r.latencies == list(answer.latencies_s)
        assert r.features and r.space == space
    assert len({r.cand_hash for r in real}) == 8  # no candidate twice
    _check_knobs(space, spec, target, real)
    # infrastructure failures: recorded under attempt ids, retried, never counted or trained on
    assert len(lost) == len(synthetic.lost) >= 1 and all("-lost-" in r.trial_id for r in lost)
    tref = db.target_by_key(first.target_key)
    assert tref is not None and len(db.training_rows(tref.id)) == 8
    ok = [res for res in replay.answered.values() if res.ok]
    assert ok and first.best_s == min(res.median_s for res in ok if res.median_s)
    assert first.best_trial == min(ok, key=lambda res: res.median_s or 0).trial_id

    answers = dict(replay.answered)
    again = tuner.run(_req(spec, target, space, 8))  # resumes: nothing left to measure
    assert again.job_id == first.job_id and again.measured_now == 0
    assert replay.answered == answers and db.count_records(job_id=first.job_id) == len(rows)

    more = tuner.run(_req(spec, target, space, 12))  # a larger budget extends the same job
    assert more.job_id == first.job_id and more.measured_now == 4 and more.trials_done == 12
    real = [r for r in db.records(job_id=first.job_id)
            if r.invalidity is not Invalidity.WORKER_LOST]
    assert len(real) == 12 and len({r.cand_hash for r in real}) == 12
    assert set(answers) < {r.trial_id for r in real}  # the first 8 were not measured again
    assert all(n == 1 for n in Counter(db.written).values())  # type: ignore[attr-defined]
    assert more.best_s == min(res.median_s for res in replay.answered.values()
                              if res.ok and res.median_s)


def _check_knobs(space: str, spec: dict[str, Any], target: dict[str, Any],
                 rows: list[Any]) -> None:
    """Every record names its candidate's knobs: a template's as `spaces` names them (each
    categorical value one of the knob's choices for this workload), auto's by position; the
    values are the trace's own decisions."""
    from schedules.naming import samples

    for r in rows:
        assert r.knobs, f"{space}: a record without knob values"
        found = samples(r.trace_json)
        assert len(r.knobs) == min(len(found), 64)
        for (name, value), (kind, attrs, decision) in zip(r.knobs.items(), found, strict=False):
            if kind == "SampleCategorical":
                assert value == attrs[0][decision], (space, name)
            else:
                assert value == decision, (space, name)
    if space == "auto":
        assert all(n.split(" ")[0] in {"tile", "categorical", "compute-at"}
                   for r in rows for n in r.knobs), rows[0].knobs
        return
    table = registry.TEMPLATES[space].knobs(parse_spec(spec))
    for r in rows:
        assert {n.split(" #")[0] for n in r.knobs} <= set(table), (space, r.knobs, list(table))


def test_a_recorded_search_replays_without_a_fallback(db: Store, tmp_path: Path) -> None:
    """Kernel Tuner's simulation mode: a search recorded in one database is replayed in another
    from the records alone; with the same seed it proposes the same candidates, so every one is
    answered from the recording (under the new job's trial ids) and the best is the same."""
    spec, target = case_for("gemm-x86")
    recorded = Tuner(db, ReplayMeasurer(fallback=Synthetic())).run(
        _req(spec, target, "gemm-x86", 12))
    replay = ReplayMeasurer.from_store(db, workload_key=recorded.workload_key,
                                       target_key=recorded.target_key)
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        again = Tuner(other, replay).run(_req(spec, target, "gemm-x86", 12))
        assert replay.replayed == 12 and replay.fell_back == 0
        assert again.best_s == recorded.best_s and again.best_trial != recorded.best_trial
        assert {r.cand_hash for r in other.records()} == {r.cand_hash for r in db.records()}
    finally:
        other.close()


def test_a_candidate_missing_from_the_recording_is_not_made_up(db: Store) -> None:
    """Without a fallback, a replay answers only what it recorded (never a worker_lost record:
    nothing was measured): anything else raises NotRecorded, and a search that asks for it
    fails its job with that message instead of learning from an invented failure."""
    spec, target = case_for("gemm-x86")
    recorded = Tuner(db, ReplayMeasurer(fallback=Synthetic())).run(
        _req(spec, target, "gemm-x86", 4))
    (row, *_) = db.records(job_id=recorded.job_id)
    db.add_records([NewRecord(
        trial_id="lost-attempt", job_id=row.job_id, workload_id=row.workload_id,
        target_id=row.target_id, space=row.space, cand_hash="e" * 16, trace_json=row.trace_json,
        invalidity=Invalidity.WORKER_LOST, tvm_version="test", error_msg="board went away")])
    replay = ReplayMeasurer.from_store(db, workload_key=recorded.workload_key,
                                       target_key=recorded.target_key)
    wl = parse_spec(spec)

    def inp(trial: str, cand_hash: str) -> MeasureInput:
        return MeasureInput(trial_id=trial, workload_key=wl.key, workload_spec=wl.spec,
                            target=target, trace_json=row.trace_json, options=OPTS,
                            context={"cand_hash": cand_hash})

    res = replay.measure_one(inp("new-trial", row.cand_hash))
    assert res.trial_id == "new-trial" and res.invalidity is row.invalidity
    assert list(res.latencies_s) == row.latencies
    for cand_hash in ("f" * 16, "e" * 16):
        with pytest.raises(NotRecorded, match="not in the recording"):
            replay.measure_one(inp("unknown", cand_hash))
    # a fresh job never proposes a measured candidate: its first one is not in the recording
    with pytest.raises(NotRecorded):
        Tuner(db, replay).run(_req(spec, target, "gemm-x86", 8, fresh=True))
    (failed,), _ = list_jobs(db, state=JobState.FAILED)
    assert failed.id != recorded.job_id and "not in the recording" in (failed.error or "")


def test_two_spaces_of_one_workload_do_not_seed_each_other(db: Store) -> None:
    """The best records of another space (here gemm-x86's) never seed the search of this one
    ("auto"): MetaSchedule's mutators expect the traces of the space they search, and fail
    inside the search on another's."""
    spec, target = case_for("gemm-x86")
    replay = ReplayMeasurer(fallback=Synthetic())
    gemm = Tuner(db, replay).run(_req(spec, target, "gemm-x86", 8))
    auto = Tuner(db, replay).run(_req(spec, target, "auto", 8))  # warm model: evolves at once
    assert gemm.trials_done == auto.trials_done == 8 and auto.job_id != gemm.job_id
    assert {r.space for r in db.records(job_id=auto.job_id)} == {"auto"}


def test_a_job_handed_off_keeps_its_state(db: Store) -> None:
    """`JobHandedOff` from the measurer (a service tuner stopping, or losing the job's lease)
    leaves the job RUNNING for another tuner to resume; any other error fails it."""
    spec, target = case_for("gemm-x86")

    def stopping(inp: MeasureInput) -> Any:
        raise JobHandedOff("tuner stopping")

    with pytest.raises(JobHandedOff):
        Tuner(db, ReplayMeasurer(fallback=stopping)).run(_req(spec, target, "gemm-x86", 4))
    (job,), _ = list_jobs(db)
    assert job.state is JobState.RUNNING and job.error is None


def _relax_linear_gelu() -> dict[str, Any]:
    from bench.fused import linear

    return {"op": "tir", "tvmscript": linear(24, 32, 16, "gelu").script()}


@pytest.mark.parametrize("spec", [
    {"op": "matmul", "shape": [256, 40, 24]},  # N off the grid: padded in the packing
    {"op": "matmul", "shape": [13, 32, 24]},  # M prime: padded by a copy of x
    "relax",  # a fused relax task (int64 indices, a gelu epilogue), as tir
], ids=["n-padded", "m-padded", "relax-gelu"])
def test_the_search_over_gemm_shapes_off_the_grid_and_fused(db: Store, spec: Any) -> None:
    spec = _relax_linear_gelu() if spec == "relax" else spec
    tuner = Tuner(db, ReplayMeasurer(fallback=Synthetic()))
    got = tuner.run(_req(spec, X86, "gemm-x86", 8))  # features and cost model run on them too
    assert got.trials_done == got.measured_now == 8, got.stop_reason
    rows = db.records(job_id=got.job_id)
    assert len(rows) == 8 and all(r.features and r.space == "gemm-x86" for r in rows)


def test_the_search_over_a_fused_relax_conv_task(db: Store) -> None:
    from bench.fused import conv2d

    spec = {"op": "tir", "tvmscript": conv2d(1, 8, 10, 16, 3, pad=1,
                                             epilogue="bn_res_relu").script()}
    got = Tuner(db, ReplayMeasurer(fallback=Synthetic())).run(_req(spec, X86, "default", 8))
    assert got.trials_done == got.measured_now == 8, got.stop_reason
    rows = db.records(job_id=got.job_id)
    assert len(rows) == 8 and all(r.features and r.space == "conv2d-nchwc-x86" for r in rows)


def test_a_failing_evolution_falls_back_to_sampling(db: Store, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """TVM's evolutionary search can fail on a program it cannot featurize (GPT-2's position-id
    gather: "args.size() == initial_indices_orig.size()"): the job samples its space instead and
    spends its budget, and never fails for it."""
    calls: list[int] = []

    def fail(self: Any) -> Any:
        calls.append(1)
        raise RuntimeError("parallel_for_dynamic error with Check failed: (args.size() == "
                           "initial_indices_orig.size()) is false:")

    monkeypatch.setattr(tv.ms.search_strategy.SearchStrategy, "generate_measure_candidates",
                        fail)
    tuner = Tuner(db, ReplayMeasurer(fallback=Synthetic()))
    done = tuner.run(_req({"op": "matmul", "shape": [16, 32, 24]}, X86, "auto", 12))
    assert done.trials_done == 12 and done.stop_reason == "budget reached"
    assert calls == [1]  # tried once: the later batches sample without trying again
    job = db.get_job(done.job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    assert "the evolutionary search failed" in caplog.text


def test_a_first_run_reports_no_candidate_as_already_measured(db: Store) -> None:
    """On an empty database nothing was measured before the run: what the evolutionary search
    proposes again after this run measured it is counted as proposed again, not as skipped
    (the CLI's "skipped (already measured)" read 3-7 on a first run), and a second run of the
    same job counts the first run's candidates as measured before."""
    spec, target = case_for("gemm-x86")
    first = Tuner(db, ReplayMeasurer(fallback=Synthetic())).run(_req(spec, target, "gemm-x86", 40))
    assert first.skipped_duplicates == 0
    assert first.reproposed > 0, "the search re-proposed nothing: the case no longer shows it"
    again = Tuner(db, ReplayMeasurer(fallback=Synthetic())).run(
        _req(spec, target, "gemm-x86", 40, fresh=True))
    assert again.skipped_duplicates > 0
