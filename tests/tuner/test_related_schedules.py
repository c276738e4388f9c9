"""Schedules of related workloads adapted to a new one (`tuner.search.transfer`): the knob values
read from a stored trace, their adaptation to other loop extents, and a warm job measuring a
relative's best schedule first (real TVM, a real sandbox, a real database)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import fused as relax_tasks
from tests.support.targets import RUN_X86
from tuner.db import Store
from tuner.measure import Invalidity, MeasureOptions
from tuner.measure.local import LocalMeasurer
from tuner.search import Tuner, TuneRequest
from tuner.search.transfer import adapt_tile, knob_values, nearest_choice
from tuner.workloads import parse_spec


def test_a_tile_keeps_its_factors_on_the_same_extent_and_takes_the_nearest_on_another() -> None:
    assert adapt_tile([2, 16, 4], 128, 64) == [2, 16, 4]
    # 768 / 4 / 16 leaves 12: 8 does not divide it, 6 is the nearest below
    assert adapt_tile([2, 8, 4, 16], 768, 64) == [2, 6, 4, 16]
    assert adapt_tile([4, 32], 96, 16) == [6, 16]  # the innermost within its maximum
    assert adapt_tile([1, 7], 48, 0) == [8, 6]
    for factors, extent in (([3, 5, 7], 60), ([16, 16], 17), ([1, 1, 64], 100)):
        got = adapt_tile(factors, extent, 0)
        assert len(got) == len(factors) and all(f >= 1 for f in got)
        prod = 1
        for f in got:
            prod *= f
        assert prod == extent


def test_a_choice_keeps_its_value_else_takes_the_nearest_by_ratio() -> None:
    assert nearest_choice(16, [0, 16, 64, 512]) == 1
    assert nearest_choice(0, [0, 16, 64, 512]) == 0
    assert nearest_choice(32, [2, 4, 8, 16, 64, 256]) == 3  # 16 before 64: the first of a tie
    assert nearest_choice(100, [2, 4, 8, 16, 64, 256]) == 4


def test_knob_values_read_a_stored_trace_and_refuse_what_a_template_never_samples() -> None:
    insts = [["GetSBlock", [], ["C", "main"], ["b0"]],
             ["SamplePerfectTile", ["l1"], [3, 16], ["v2", "v3", "v4"]],
             ["SampleCategorical", [], [[0, 16, 64], [0.3, 0.3, 0.4]], ["v5"]]]
    trace = json.dumps([insts, [[2, 1], [1, [2, 8, 4]]]])
    assert knob_values(trace) == [("SamplePerfectTile", [2, 8, 4]), ("SampleCategorical", 16)]
    other = json.dumps([[*insts, ["SampleComputeLocation", ["b0"], [], ["l6"]]],
                        [[1, [2, 8, 4]], [3, 1]]])
    assert knob_values(other) is None
    assert knob_values("not json") is None
    assert knob_values(json.dumps([insts, [[9, 1]]])) is None  # no such instruction


OPTS = MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=2)


def _tune(store: Store, tvmscript: str, trials: int) -> Any:
    with LocalMeasurer() as m:
        return Tuner(store, m).run(TuneRequest(
            workload=parse_spec({"op": "tir", "tvmscript": tvmscript}), target=RUN_X86,
            trials=trials, batch_size=4, options=OPTS, space="gemm-x86"))


@pytest.mark.slow
def test_a_new_workload_first_measures_its_relatives_best_schedules(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same GEMM behind another epilogue starts from the relative's fastest schedules as
    recorded; a GEMM of another shape from them adapted, and those build and pass the sandbox's
    check; with transfer off, neither."""
    plain = _tune(store, relax_tasks.linear(64, 64, 64).script(), 6)
    tref = store.target_by_key(plain.target_key)
    assert tref is not None
    best = [knob_values(r.trace_json) for r in store.best(
        store.records(job_id=plain.job_id)[0].workload_id, tref.id, k=2)]

    twin = _tune(store, relax_tasks.linear(64, 64, 64, "relu").script(), 4)
    first = store.records(job_id=twin.job_id, order="id")
    assert [knob_values(r.trace_json) for r in first[:2]] == best
    assert all(r.invalidity is Invalidity.OK for r in first)

    other = _tune(store, relax_tasks.linear(48, 96, 64, "relu").script(), 4)
    rows = store.records(job_id=other.job_id, order="id")
    assert all(r.invalidity is Invalidity.OK for r in rows)
    head = knob_values(rows[0].trace_json)
    assert head is not None and head != best[0]  # adapted to 48 × 96 ...
    assert [kind for kind, _ in head] == [kind for kind, _ in best[0] or []]  # ... same knobs

    from tuner.core.config import get_settings
    from tuner.search import transfer

    calls: list[int] = []
    real = transfer.candidates
    monkeypatch.setattr(transfer, "candidates", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("TUNEFARM_COST_MODEL_TRANSFER", "0")
    get_settings.cache_clear()
    try:
        off = _tune(store, relax_tasks.linear(64, 64, 64, "gelu").script(), 2)
        assert off.trials_done == 2 and calls == []
    finally:
        get_settings.cache_clear()


def test_a_record_goes_to_the_design_space_of_its_loop_order_whatever_the_epilogue() -> None:
    """Two design spaces differ only in a reorder's loop order; the record's trace has more
    blocks (an epilogue: other random-variable numbers, inlining) and the second order."""
    from tuner.search.transfer import closest, structure

    def trace(children: int, order: tuple[int, int], inline: int) -> str:
        blocks = [f"b{i}" for i in range(1, children + 1)]
        insts = [["GetSBlock", [], ["C", "main"], ["b0"]],
                 ["GetChildBlocks", ["b0"], [], blocks],
                 *[["ComputeInline", [b], [], []] for b in blocks[1:1 + inline]],
                 ["GetLoops", ["b1"], [], ["l10", "l11"]],
                 ["SamplePerfectTile", ["l10"], [2, 16], ["v12", "v13"]],
                 ["Split", ["l10", None, "v13"], [1, 0], ["l14", "l15"]],
                 ["Reorder", [["l14", "l11"][order[0]], ["l14", "l11"][order[1]]], [], []],
                 ["Parallel", ["l14"], [], []]]
        return json.dumps([insts, [[4, [4, 16]]]])

    designs = [structure(trace(1, (0, 1), 0)), structure(trace(1, (1, 0), 0))]
    assert designs[0] != designs[1]
    assert closest(structure(trace(4, (1, 0), 3)), designs) == 1
    assert closest(structure(trace(4, (0, 1), 3)), designs) == 0
