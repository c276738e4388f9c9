"""Standalone activations on x86 with AVX2 or AVX-512 (fp32): `activation-x86`, for any
PrimFunc that `schedules/match_rows.py` reads as a chain of elementwise and injective blocks
around one erf, tanh or sigmoid (relax's GELU when it is not fused into a GEMM:
`reshape → x·½(1 + erf(x/√2)) → reshape`, the SiLU of a gated MLP).

MetaSchedule's generated space inlines such a chain into one loop nest, in which LLVM calls libm's
`erff` / `tanhf` / `expf` once per element: a BERT-base GELU over 128×3072 took 680 µs on 2 Zen 5
cores. The template instead:

- folds the blocks before the activation into the one computing its input, and those after it
  into the output's block (`compute_inline`; a final copy, relax's reshape back, the other way:
  `reverse_compute_inline`): a pass over memory each would cost more than the arithmetic;
- tiles the output's last dimension into steps of `vectors` × 16 lanes (× 8 for a row that is a
  multiple of 8 but not of 16: Whisper's 3,000 frames), splits a row's steps into
  [outer, inner] (knob `tile`) and runs the other dimensions and the outer steps in parallel;
- computes the activation's input and the activation at each step (`compute_at`: a few vectors of
  scratch), the activation tensorized with the polynomial of `schedules/intrinsics.py` (absolute
  error < 5e-7), the input and the output vectorized.

The template applies only when the schedule gives each step exactly its own vectors of the
activation (a reshape that moves the last dimension would make `compute_at` recompute more):
`why_not` schedules the function once to check.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from schedules.base import StructuralTemplate, is_x86, vector_lanes
from schedules.intrinsics import activation_f32, use
from schedules.knobs import Categorical, PerfectTile, divides, knob_table
from schedules.match_rows import ActivationMatch, match_activation
from tuner.core.tvm_api import fuse
from tuner.workloads import Workload

if TYPE_CHECKING:
    from tuner.core.tvm_api import SBlock, Schedule, Target, tvm

LANES = 16
# AVX2 takes the same schedule: LLVM computes each 16-lane vector as two 8-lane halves
MIN_LANES = 8


def row_lanes(row: int) -> int:
    """The lanes of a step's vectors: 16, or 8 for a row that is a multiple of 8 but not of 16
    (Whisper's 3,000 frames); 0 for neither."""
    return LANES if row % LANES == 0 else MIN_LANES if row % MIN_LANES == 0 else 0


class ActivationX86(StructuralTemplate):
    name = "activation-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    ops = ("tir",)
    description = ("elementwise chain around an erf, tanh or sigmoid: folded into the "
                   "activation's input and the output, computed per step of 16-lane vectors "
                   "(8-lane where the row is a multiple of 8, not 16) "
                   "in parallel, the activation tensorized with a vector polynomial")
    tensorize = False  # the trace tensorizes the activation itself
    population_size = 32  # a few dozen points at most
    KNOBS = knob_table(
        vectors=Categorical((1, 2, 4), probs=(0.4, 0.35, 0.25), fits=divides, fallback=1,
                            doc="16-lane vectors per step (those dividing the last "
                                "dimension / 16; 8-lane ones off the 16 grid)"),
        tile=PerfectTile(2, max_innermost=4, of="steps of a row",
                         doc="a row's steps split into [parallel (with the rows), at most 4 "
                             "serial]"),
    )
    # small on purpose: on BERT's GELU (F17) all 36 points of a space with any serial count and
    # an unroll knob (0, 16, 64) measured within 67-71 µs; more points only cost tuning time

    def why_not(self, workload: Workload, target: Target) -> str | None:
        m = match_activation(workload)
        if not isinstance(m, ActivationMatch):
            return m.reason
        if not is_x86(target) or vector_lanes(target, 32) < MIN_LANES:
            return "not an x86 LLVM target with AVX2 or AVX-512"
        if not row_lanes(m.row):
            return f"the last dimension ({m.row}) is not a multiple of {MIN_LANES}"
        if "check:activation" not in workload._cache:
            workload._cache["check:activation"] = _steps_problem(self, workload, target, m)
        return workload._cache["check:activation"]

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        m = match_activation(workload)
        assert isinstance(m, ActivationMatch)
        return {"vectors": m.row // row_lanes(m.row)}

    def schedule(self, sch: Schedule, workload: Workload, target: Target) -> None:
        m = match_activation(workload)
        assert isinstance(m, ActivationMatch), m
        _schedule(self, sch, m)


def _schedule(t: ActivationX86, sch: Schedule, m: ActivationMatch) -> tuple[int, int]:
    """Schedule `sch`; returns the activation's elements computed per step and the output's."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [cast("SBlock", sch.get(b)).name_hint for b in blocks]
    at = names.index(m.act)
    for b, name in zip(blocks[:at], names[:at], strict=True):
        if name != m.input_block:
            sch.compute_inline(b)
    k = m.copy_out
    for b in blocks[at + 1:-1 - k if k else -2]:
        sch.compute_inline(b)
    if k:  # relax's reshape back (and a cast): folded the other way, so that the blocks'
        # indices stay those of the activation (through a reshape, compute_at could not tell
        # which elements a step needs)
        for b in reversed(blocks[-k:]):
            sch.reverse_compute_inline(b)
        out = blocks[-1 - k]
    else:
        if at < len(blocks) - 2:
            sch.compute_inline(blocks[-2])
        out = blocks[-1]
    *rows, j = sch.get_loops(out)
    width = row_lanes(m.row)
    v = t.sample(sch, "vectors", extent=m.row // width)
    step = int(cast(int, sch.get(v))) * width  # the output's elements per step
    jo, jv, jl = sch.split(j, [None, v, width])
    # the steps of a row split [outer, inner], the outer fused with the rows and run in parallel
    # (a split of rows and steps fused would leave bindings `tensorize` cannot blockize)
    j0, ser = t.split(sch, "tile", jo)
    sch.parallel(fuse(sch, *rows, j0) if rows else j0)
    act = sch.get_sblock(m.act)
    if at < len(blocks) - 1:
        sch.compute_at(act, ser, preserve_unit_loops=True)
    if m.input_block is not None:
        producer = sch.get_sblock(m.input_block)
        sch.compute_at(producer, ser, preserve_unit_loops=True)
        _, lanes = sch.split(fuse(sch, *sch.get_loops(producer)[2:]), [None, width])
        sch.vectorize(lanes)
    intrin = use(activation_f32(m.fn, width))
    if at == len(blocks) - 1:  # the activation writes the output: its own lanes are the step's
        sch.tensorize(jl, intrin)
        return step, step
    own = sch.get_loops(act)[2:]
    per_step = math.prod(int(cast("tvm.tirx.IntImm", cast("tvm.tirx.For", sch.get(loop)).extent))
                         for loop in own)
    _, lanes = sch.split(fuse(sch, *own), [None, width])
    sch.tensorize(lanes, intrin)
    sch.vectorize(jl)
    return per_step, step


def _steps_problem(t: ActivationX86, workload: Workload, target: Target,
                   m: ActivationMatch) -> str | None:
    """Schedule the function once: None when every step computes exactly its own vectors of the
    activation, else why the template does not serve it."""
    from tuner.core.tvm_api import tvm

    sch = tvm.s_tir.Schedule(workload.mod(), seed=1)
    try:
        per_step, out = _schedule(t, sch, m)
    except Exception as exc:  # a primitive refused the chain's shape
        return f"the chain cannot be tiled per vector: {str(exc).splitlines()[0][:160]}"
    if per_step != out:
        return (f"each step would compute {per_step} elements of the activation for "
                f"{out} of the output (a reshape moves its last dimension)")
    return None
