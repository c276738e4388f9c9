"""Naming a candidate's knob values (`schedules.naming`): from a design space's sampling
instructions to `{knob: value}`, on trace JSON as MetaSchedule writes it, and on a template's
real design space."""

from __future__ import annotations

import json

from schedules import naming
from schedules.naming import KnobNamer, samples, signature

# [insts, decisions]: an inst is [kind, inputs, attrs, outputs]
TRACE = [
    [["GetSBlock", [], ["C", "main"], ["b0"]],
     ["GetLoops", ["b0"], [], ["l1", "l2"]],
     ["SampleCategorical", [], [[0, 16, 64], [0.3, 0.4, 0.3]], ["v3"]],
     ["SamplePerfectTile", ["l1"], [2, 16], ["v4", "v5"]],
     ["SampleCategorical", [], [[4, 8], [0.5, 0.5]], ["v6"]]],
    [[2, 1], [3, [4, 16]], [4, 0]],
]


def test_samples_are_the_decided_instructions_in_order() -> None:
    found = samples(json.dumps(TRACE))
    assert [k for k, _, _ in found] == ["SampleCategorical", "SamplePerfectTile",
                                        "SampleCategorical"]
    assert [d for _, _, d in found] == [1, [4, 16], 0]


def test_a_known_design_space_names_the_knobs_and_gives_chosen_values() -> None:
    sig = signature(samples(TRACE))
    namer = KnobNamer([(sig, ["unroll", "tile_m", "mr"])])
    assert namer(json.dumps(TRACE)) == {"unroll": 16, "tile_m": [4, 16], "mr": 4}
    # other decisions, same design space: the same names
    other = [TRACE[0], [[2, 2], [3, [64, 1]], [4, 1]]]
    assert namer(other) == {"unroll": 64, "tile_m": [64, 1], "mr": 8}


def test_an_unknown_trace_gets_positional_names() -> None:
    assert KnobNamer()(TRACE) == {"categorical 0": 16, "tile 1": [4, 16], "categorical 2": 4}


def test_a_knob_sampled_twice_is_numbered_and_ambiguous_spaces_fall_back() -> None:
    sig = signature(samples(TRACE))
    assert list(KnobNamer([(sig, ["u", "t", "u"])])(TRACE)) == ["u", "t", "u #2"]
    # two design spaces with one signature but other names: no guess
    both = KnobNamer([(sig, ["a", "b", "c"]), (sig, ["x", "y", "z"])])
    assert list(both(TRACE)) == ["categorical 0", "tile 1", "categorical 2"]


def test_names_are_noted_only_while_recording_one_list_per_design_space() -> None:
    naming.note("outside")  # no recording: nothing kept, no error
    with naming.recording() as notes:
        naming.begin_space()
        naming.note("a")
        naming.begin_space()
        naming.note("b")
        naming.note("c")
    assert notes == [["a"], ["b", "c"]]


def test_a_template_space_is_named_as_spaces_names_its_knobs() -> None:
    from schedules import registry
    from tuner.core import tvm_api as tv
    from tuner.workloads import parse_spec

    wl = parse_spec({"op": "dense", "shape": [64, 64, 64]})
    target = tv.make_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    namer = registry.knob_namer("gemm-x86", wl, target)
    ctx = tv.tune_context(wl.mod(), target, space=registry.TEMPLATES["gemm-x86"].space(wl, target),
                          strategy=registry.search_strategy("gemm-x86"), seed=0, num_threads=1)
    (design, *_) = tv.design_spaces(ctx)
    named = namer(tv.trace_to_json(design.trace))
    assert named and set(named) <= set(registry.TEMPLATES["gemm-x86"].knobs(wl))
    assert "tile 0" not in named
