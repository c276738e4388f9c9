"""Row normalisations on x86 (float32): `norm-x86`, for any PrimFunc `schedules/match_norm.py`
reads as one: relax's layer norm (a row sum, the mean, a sum of squared deviations, the
normalisation with gamma and beta), RMS norm (its casts, a sum of squares, a reciprocal square
root), over any number of leading row dimensions.

The template:

- folds every elementwise block and the per-column vectors into the blocks that read them
  (`compute_inline`), so a row is read once per sum and once by the normalisation;
- runs the rows in parallel (the leading dimensions fused with the outer part of the last row
  dimension: knob `rows`) and computes each row's sums and per-row values at the row (`compute_at`);
- computes each row sum as 16, 32 or 64 partial sums (knob `accumulators`: 1, 2 or 4 AVX-512
  vectors, independent add chains; 8 or 4 lanes each on narrower targets or rows) and a halving
  tree (`rfactor`, as softmax-x86 does), and the normalisation as vectors.

Rows that no power-of-two vector divides (a length not a multiple of 4) keep the template in
odd widths (measured on 2 Zen 5 cores, RMS norm 128×1026 at 64 × 2 rows, `bench/RESULTS.md` Run AG):

- each row sum is one level of partial sums (rfactor), summed serially, as many as the row's
  largest divisor up to 16, 32 or 64 (knob `accumulators`: 9, 27 or 57 for a row of 1026:
  9.7, 5.8 and 6.5 µs, as a loop, unrolled);
- the normalisation is one vector of the whole row, which LLVM splits into legal ones, or a plain
  loop that LLVM's loop vectorizer takes (knob `normalise`; the vector beat 15-lane steps, 18
  against 28 µs on 256×390; with 27 partials, unrolled: vector 7.7, loop 5.8 µs), or vectors
  of the target's width with the last one partial and peeled off (`peeled`). On 2 Xeon
  (Emerald Rapids) cores the whole row's speed depends on where the output lies against the
  input (RMS norm 128×1026: 12.2–15.5 µs over 16 page offsets of the output, MetaSchedule's
  kernel 12.2–13.3), the peeled vectors' much less (10.6–12.7); tuned with it, that task's
  picks read 0.89–0.90× MetaSchedule's kernel over 24 random placements, 0.97–1.04× without
  it (bench/RESULTS.md Run BB);
- the row's loops are unrolled or not (knob `unroll`): 7.2 → 5.8 µs with 27 partials and the
  loop (the unrolled kernel's assembly has half the lane inserts that assemble odd-width
  vectors, 76 against 152, and 21 stack accesses against 52);
- rows longer than `MAX_ROW` go in steps of the largest divisor up to the vector width; this form
  needs a divisor from 2 to 8 (AVX2's width, so that the same spaces serve every x86 target);
- or the row sums go in whole vectors and a predicated last one (knob `sums`: "tail"): 16 or 32
  partial sums (1 or 2 AVX-512 vectors) over the row, the last vector's lanes past the row
  masked by the split's predicate. TVM 0.27 drops that predicate from a block that `compute_at`
  moves (the sum would then read past the row), and `rfactor` cannot split a sum off a row loop
  it shares with other blocks. So each sum is a parallel pass of its own over the rows (rfactor
  at the root), with the per-row values that follow it (a mean, a reciprocal square root), and
  the normalisation another pass: every row is read once more from L2, in plain vectors. The
  last, partial vector of each row loop is peeled off (`pragma_loop_partition_hint`). On 2 Xeon
  (Emerald Rapids) cores, tuned at 64 trials, the best kernel of this form against the best of
  the divisor form, timed side by side: layer norm 256×390 0.87×, RMS norm 128×1026 0.89–0.98×
  in four timings. Hand-written on the RMS norm: 32 partials 0.85×, 16 0.87×, 64 0.92×; without
  the peeling 2.0× (bench/RESULTS.md Run AU). A row with no divisor from 2 to 8 (a prime) gets
  this form only; one of 16 or fewer of them, neither (the generated space).

Summation order changes (partial sums), within any tolerance a float32 normalisation has. With one
accumulator, a row sum waits an add's latency per vector: on 2 Xeon (Emerald Rapids) cores, BERT's
layer norm 128×768 took 18.5 µs with one and 14.0 µs tuned over 1, 2 and 4 (MetaSchedule@64:
19.8-24.3 µs; PyTorch's F.layer_norm 36 µs).
"""

from __future__ import annotations

from typing import Any

from schedules.base import StructuralTemplate, is_x86, vector_lanes
from schedules.knobs import Categorical, DesignSpace, PerfectTile, knob_table
from schedules.match_norm import COLUMN, ELEMENTWISE, ROW, SUM, NormMatch, match_norm
from schedules.row_intrinsics import MAX_ROW
from schedules.softmax import (
    iters_row_red_lanes,
    softmax_lanes,
    tree_rfactor,
)
from tuner.core.tvm_api import LoopRV, SBlockRV, Schedule, Target, fuse, ms, split_loop
from tuner.workloads import Workload

MAX_ROWS_PER_TASK = 16
ACCUMULATORS = ("1", "2", "4")
NORMALISE = ("vector", "loop", "peeled")
SUMS = ("divisors", "tail")
TAIL_ACCUMULATORS = ("1", "2")  # 4 (64 partials) measured slower on a row of 1026


def norm_lanes(cols: int, target: Target) -> int:
    """fp32 lanes of the row loops: softmax's (the vector width, or 8 or 4, dividing the row);
    off that grid, the largest divisor of the row up to the vector width; 0 if it has none but 1."""
    return softmax_lanes(cols, target) or odd_lanes(cols, vector_lanes(target, 32))


def odd_lanes(cols: int, most: int) -> int:
    """The largest divisor of `cols` from 2 to `most`; 0 if there is none."""
    return next((d for d in range(most, 1, -1) if cols % d == 0), 0)


def divisor_form(cols: int) -> bool:
    """Whether a row of `cols` can take the divisor form: on the 4 grid, or a divisor from 2 to
    8 (the narrowest x86 vector width)."""
    return cols % 4 == 0 or odd_lanes(cols, 8) > 0


def tail_form(cols: int, accumulators: str = "1") -> bool:
    """Whether a row of `cols` can take the tail form with `accumulators` vectors: off the 4 grid
    and longer than those vectors at AVX-512's 16 lanes."""
    return cols % 4 != 0 and 16 * int(accumulators) < cols


def partial_count(cols: int, width: int, accumulators: str) -> int:
    """How many partial sums a row of `cols` takes with `accumulators` vectors of `width` lanes:
    on the 4 grid, the vectors' lanes where they divide the row; off it, the row's largest divisor
    up to the vectors' lanes; 0 if there is none."""
    most = width * int(accumulators)
    if cols % 4 == 0:
        return most if cols % most == 0 else 0
    return odd_lanes(cols, most)


def _peeled_vectors(sch: Schedule, steps: LoopRV, vector: LoopRV) -> None:
    """A loop split into `steps` of one `vector` (the last one partial, under the split's
    predicate): that step peeled off by LoopPartition, so that the others are plain vectors."""
    sch.annotate(steps, "pragma_loop_partition_hint", 1)
    sch.vectorize(vector)


def partial_sums(sch: Schedule, block: SBlockRV, partials: int, rows: int) -> list[SBlockRV]:
    """The rfactor blocks of a row sum reduced as `partials` vector lanes (consumer first): a
    halving tree for a power of two (`tree_rfactor`), else one rfactor block whose lanes
    `block` then sums serially."""
    if partials & (partials - 1) == 0:
        return tree_rfactor(sch, block, partials, rows)
    sch.split(sch.get_loops(block)[-1], [None, partials])
    return [sch.rfactor(sch.get_loops(block)[-1], factor_axis=rows)]


class NormX86(StructuralTemplate):
    name = "norm-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    ops = ("tir",)
    description = ("fp32 row normalisations (layer norm, RMS norm): elementwise blocks folded, "
                   "rows in parallel, each row's sums as vector partials with a log-tree "
                   "horizontal reduction, the normalisation vectorized. Rows off the 4 grid: "
                   "partials of the row's largest divisor up to 16, 32 or 64 lanes, the "
                   "normalisation a vector, a loop for LLVM or peeled vectors, unrolled or "
                   "not; or the sums in passes of their own, in whole vectors and a "
                   "predicated last one.")
    tensorize = False
    population_size = 16  # small spaces: the rows knob's divisors (x unroll off the 4 grid)
    KNOBS = knob_table(
        rows=PerfectTile(2, max_innermost=MAX_ROWS_PER_TASK, of="the last row dimension",
                         doc="[parallel (with the outer row dimensions), rows per task]"),
        accumulators=DesignSpace(ACCUMULATORS, doc="vector accumulators of each row sum "
                                                   "(independent add chains): those for which "
                                                   "16 lanes each divide the row; off the 4 "
                                                   "grid, partials of the row's largest divisor "
                                                   "up to 16 lanes per accumulator"),
        normalise=DesignSpace(NORMALISE, doc="off the 4 grid: the normalisation as one vector "
                                             "of the whole row, a loop left to LLVM's loop "
                                             "vectorizer, or vectors of the target's width "
                                             "with the last one peeled (on the grid: vectors "
                                             "of the lanes)"),
        unroll=Categorical((0, 512), doc="off the 4 grid: the explicit unroll depth of a "
                                         "row's loops (pragma_auto_unroll_max_step)"),
        sums=DesignSpace(SUMS, doc="off the 4 grid: the row sums as partials of the row's "
                                   "divisor in the row's loop, or each a pass of its own in "
                                   "whole vectors and a predicated last one"),
    )

    def why_not(self, workload: Workload, target: Target) -> str | None:
        m = match_norm(workload)
        if not isinstance(m, NormMatch):
            return m.reason
        if not is_x86(target):
            return "not an x86 LLVM target"
        if not (divisor_form(m.cols) or tail_form(m.cols)):
            return (f"the row length ({m.cols}) has no divisor from 2 to 8 and is no longer than "
                    "one 16-lane vector")
        return None

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        m = match_norm(workload)
        assert isinstance(m, NormMatch)
        return {"rows": m.last_rows}

    def design_variants(self, workload: Workload) -> list[dict[str, Any]]:
        m = match_norm(workload)
        assert isinstance(m, NormMatch)
        # the partial sums as on AVX-512 (16 lanes), one space for each distinct count (a
        # narrower target's `schedule` takes fewer where these do not fit it)
        counts = [partial_count(m.cols, 16, acc) for acc in ACCUMULATORS]
        distinct = [acc for i, acc in enumerate(ACCUMULATORS)
                    if i == 0 or (counts[i] and counts[i] not in counts[:i])]
        loop_too = m.cols % 4 != 0 and m.cols <= MAX_ROW  # where `normalise` has a choice
        return [v for v in super().design_variants(workload)
                if (v["sums"] == "divisors" and divisor_form(m.cols)
                    and v["accumulators"] in distinct
                    and (loop_too or v["normalise"] == "vector"))
                or (v["sums"] == "tail" and v["accumulators"] in TAIL_ACCUMULATORS
                    and tail_form(m.cols, v["accumulators"]) and v["normalise"] == "vector")]

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *,
                 accumulators: str, normalise: str = "vector", sums: str = "divisors") -> None:
        m = match_norm(workload)
        assert isinstance(m, NormMatch), m
        for name, kind in m.kinds[:-1]:
            if kind in (ELEMENTWISE, COLUMN):
                sch.compute_inline(sch.get_sblock(name))
        if sums == "tail":
            self._schedule_tail(sch, m, target, accumulators)
            return
        lanes = norm_lanes(m.cols, target)
        partials = partial_count(m.cols, vector_lanes(target, 32), accumulators) or lanes
        out_name = m.kinds[-1][0]
        chains = {}  # each row sum with its rfactor blocks (consumer first)
        for name in m.named(SUM):
            block = sch.get_sblock(name)
            chains[name] = [block, *partial_sums(sch, block, partials, m.row_dims)]
            for b in chains[name]:
                iters_row_red_lanes(sch, b, m.row_dims)

        out = sch.get_sblock(out_name)
        *leading, i, j = sch.get_loops(out)
        r0, r1 = self.split(sch, "rows", i)
        sch.parallel(fuse(sch, *leading, r0) if leading else r0)
        # consumers first: each block moves under r1 after everything that reads it
        for name, kind in reversed(m.kinds[:-1]):
            if kind == ROW:
                sch.compute_at(sch.get_sblock(name), r1, preserve_unit_loops=True)
            elif kind == SUM:
                for b in chains[name]:
                    sch.compute_at(b, r1, preserve_unit_loops=True)
        if m.cols % 4 == 0:
            _, j1 = sch.split(j, [None, lanes])
            sch.vectorize(j1)
        else:  # off the grid
            sch.annotate(r1, "pragma_auto_unroll_max_step", self.sample(sch, "unroll"))
            sch.annotate(r1, "pragma_unroll_explicit", 1)
            if m.cols > MAX_ROW:
                _, j1 = sch.split(j, [None, lanes])
                sch.vectorize(j1)
            elif normalise == "vector":  # LLVM splits the whole row into full vectors
                sch.vectorize(j)
            elif normalise == "peeled":
                _peeled_vectors(sch, *sch.split(j, [None, vector_lanes(target, 32)]))
        for chain in chains.values():
            # loops under r1: row, reduced, one per lane bit (rf stage s has s + 1 bits)
            for bits, rf in enumerate(chain[1:], start=1):
                sch.vectorize(fuse(sch, *sch.get_loops(rf)[-bits:]))

    def _schedule_tail(self, sch: Schedule, m: NormMatch, target: Target,
                       accumulators: str) -> None:
        """`sums` = "tail": each row sum a parallel pass of its own (rfactor at the root, where
        the split's predicate stays), in whole vectors and a predicated last one; the per-row
        values computed in the pass of the sum they follow; then the normalisation. The
        elementwise blocks are inlined already."""
        lanes = vector_lanes(target, 32)
        *leading, i, j = sch.get_loops(sch.get_sblock(m.kinds[-1][0]))
        factors = self.tile(sch, "rows", i)  # one split of the rows for every pass
        unroll = self.sample(sch, "unroll")

        # [*leading, last row dimension]: the rows in parallel
        def rows(loops: list[LoopRV]) -> LoopRV:
            *lead, row = loops
            r0, r1 = split_loop(sch, row, factors)
            sch.parallel(fuse(sch, *lead, r0) if lead else r0)
            sch.annotate(r1, "pragma_auto_unroll_max_step", unroll)
            sch.annotate(r1, "pragma_unroll_explicit", 1)
            return r1

        rows([*leading, i])
        _peeled_vectors(sch, *sch.split(j, [None, lanes]))
        row = None  # the row loop of the last sum's pass
        for name, kind in m.kinds[:-1]:
            if kind == SUM:
                block = sch.get_sblock(name)
                _, partial = sch.split(sch.get_loops(block)[-1], [None, lanes * int(accumulators)])
                rf = sch.rfactor(partial, factor_axis=m.row_dims)
                *row_loops, steps, vector = sch.get_loops(rf)
                row = rows(row_loops)
                _peeled_vectors(sch, steps, vector)
                sch.reverse_compute_at(block, row, preserve_unit_loops=True)
                # the partials' zeroing split off here: MetaSchedule's RewriteReductionBlock
                # rejects a layer norm's second sum in this form
                init = sch.decompose_reduction(rf, steps)
                sch.vectorize(sch.get_loops(init)[-1])
            elif kind == ROW and row is not None:
                sch.reverse_compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        return {ms.mutator.MutateTileSize(): 1.0}
