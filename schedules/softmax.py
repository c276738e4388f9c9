"""Softmax over the last axis on x86: `softmax-x86` (float32), for any PrimFunc whose blocks
`schedules/match_rows.py` reads as topi's softmax: the op spec, and relax's form over [batch,
heads, rows, cols] (int64, the dimensions before the last row dimension run in parallel with the
row tiles) with plain copies after it, folded into the normalisation.

topi.nn.softmax is four blocks: maxelem (row max), exp (exp(x - max)), expsum (row sum), norm
(exp / sum). The template fuses them per row block inside one parallel loop:

    parallel r0                                     <- knob "rows": r0 x r1 x r2 = rows
      r1
        max:  16-lane partial maxima (rfactor), then a log2 tree 16 -> 8 -> 4 -> 2 -> 1
        exp:  tensorized with a fast vector exp (schedules/intrinsics.py)
        sum:  16-lane partial sums (rfactor), then the same tree
        norm: vectorized division, or multiplication by the reciprocal (knob "norm")
      (each of these loops over the r2 rows of the step)

Measured on one core for 1536x128 (shared machine, rough): with plain `T.exp` ~560 us, because
LLVM lowers a vector exp to one libm `expf` call per lane; with the polynomial exp ~65 us (rel.
err. < 3e-7, the op's tolerance is 1e-4); with the tree (each row's two 16-step serial horizontal
reductions become 4 vector steps) ~55 us; with rf buffers laid out [row, lane] (contiguous lanes
when r2 > 1) ~45-50 us. PyTorch's torch.softmax took ~2x as long as the tuned kernel in the same
process on one thread. Summation order changes (partial sums), well within the tolerance.

The exp and norm rewrites happen by tensorization with intrinsics whose descriptions are exactly
the blocks' bodies, so the PrimFunc (and its workload key) is untouched.

Rows no vector width divides (ViT's 197 tokens) keep the template another way: each of the four
steps tensorizes a whole row (`schedules/row_intrinsics.py`, which says why the split loops do
not work there), under the same parallel row loop, one row per step.
"""

from __future__ import annotations

from typing import cast

from schedules.base import StructuralTemplate, is_x86, vector_lanes
from schedules.intrinsics import DIV_BCAST_F32, EXP_SUB_F32, use
from schedules.knobs import Categorical, DesignSpace, Fixed, PerfectTile, knob_table
from schedules.match_rows import SoftmaxMatch, match_softmax
from schedules.row_intrinsics import MAX_ROW, ROW_DIV, ROW_EXP_SUB, ROW_MAX, ROW_SUM, row_fits
from tuner.core.tvm_api import SBlock, SBlockRV, Schedule, Target, fuse, ms, split_loop
from tuner.workloads import Workload

MAX_ROWS_PER_STEP = 4
UNROLL = (0, 16, 64, 512)
NORMS = ("reciprocal", "divide")  # one design space each


def softmax_lanes(cols: int, target: Target) -> int:
    """fp32 lanes for the row loops of `cols` columns: the target's vector width, or the largest
    of 8/4 that divides the row length; 0 if none does."""
    for lanes in (vector_lanes(target, 32), 8, 4):
        if lanes <= vector_lanes(target, 32) and cols % lanes == 0:
            return lanes
    return 0


def row_loops_problem(cols: int, target: Target) -> str | None:
    """Why rows of `cols` columns get neither vector row loops nor, off the 4 grid, the
    whole-row intrinsics on `target` (None: they get one of them)."""
    if not is_x86(target):
        return "not an x86 LLVM target"
    lanes = vector_lanes(target, 32)
    if softmax_lanes(cols, target) == 0 and not row_fits(cols, lanes):
        return (f"the row length ({cols}) is not a multiple of 4, and not between one "
                f"vector ({lanes}) and {MAX_ROW}")
    return None


def tree_rfactor(sch: Schedule, block: SBlockRV, lanes: int, rows: int) -> list[SBlockRV]:
    """Reduce `block` (a reduction over its last loop, `lanes` a power of two dividing it) as
    `lanes` vector partials followed by a halving tree: with k = k0 * lanes + l and l split into
    its bits b_{n-1} .. b_0, rfactor peels one bit at a time, so `block` reduces b_0 (2 -> 1),
    block_rf reduces b_1 (4 -> 2), ..., and the last, block_rf_..._rf, reduces k0 into `lanes`
    partials. (rfactor-ing `block` itself repeatedly would give every stage the same name.)
    Every rf buffer is [*rows, bits...] (`rows` leading dimensions): the lanes of a row are
    contiguous. Returns the rfactor blocks, consumer first."""
    bits = lanes.bit_length() - 1
    split_loop(sch, sch.get_loops(block)[-1], [None] + [2] * bits)
    chain, cur = [], block
    for s in range(bits):
        cur = sch.rfactor(sch.get_loops(cur)[-1 - s], factor_axis=rows)
        chain.append(cur)
    return chain


def iters_row_red_lanes(sch: Schedule, block: SBlockRV, rows: int) -> None:
    """Order the block iters of an rfactor block as (rows..., reduced..., lane bits...), so that
    the loops compute_at creates come in that order."""
    b = cast(SBlock, sch.get(block))
    region = b.writes[0].region  # rf buffer [*rows, bits...]
    lanes = [r.min for r in region[rows:]]
    order_lane = [i for v in lanes for i, iv in enumerate(b.iter_vars) if iv.var.same_as(v)]
    order_red = [i for i, iv in enumerate(b.iter_vars) if int(iv.iter_type) != 0]
    order_row = [i for i in range(len(b.iter_vars)) if i not in order_lane + order_red]
    sch.reorder_block_iter_var(block, order_row + order_red + order_lane)


class SoftmaxX86(StructuralTemplate):
    name = "softmax-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    ops = ("softmax", "tir")
    description = ("fp32 softmax over the last axis, fused per row block under one parallel "
                   "loop: vector partial max/sum (rfactor) with a log-tree horizontal reduction, "
                   "fast polynomial exp (tensorized), reciprocal-multiply or divide; knobs for "
                   "row blocking, parallel granularity, unroll. Rows off the 4 grid: each step "
                   "tensorized over the whole row.")
    tensorize = False  # the trace tensorizes exp/norm itself
    population_size = 64  # a small space (512 points) with a long trace: replay costs ~20 ms
    KNOBS = knob_table(
        rows=PerfectTile(3, max_innermost=MAX_ROWS_PER_STEP, of="rows",
                         doc="rows (of the last dimension before the columns) = r0 x r1 x r2: "
                             "r0 = parallel tasks (granularity; times the outer dimensions), "
                             "r1 = row steps per task, r2 = rows computed together per step "
                             "(ILP vs. temporaries)"),
        unroll=Categorical(UNROLL, doc="pragma_auto_unroll_max_step (explicit) on the parallel "
                                       "loop"),
        norm=DesignSpace(NORMS, doc="exp / sum as a vector division or as exp * (1 / sum) "
                                    "(<= 1.5 ulp apart)"),
        lanes=Fixed("16 (AVX-512), else 8 or 4 dividing cols; off the 4 grid, the target's",
                    doc="vector width of every row loop"),
    )

    def why_not(self, workload: Workload, target: Target) -> str | None:
        m = match_softmax(workload)
        if not isinstance(m, SoftmaxMatch):
            return m.reason
        return row_loops_problem(m.cols, target)

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        m = match_softmax(workload)
        assert isinstance(m, SoftmaxMatch)
        return {"rows": m.last_rows}

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *, norm: str) -> None:
        m = match_softmax(workload)
        assert isinstance(m, SoftmaxMatch), m
        lanes = softmax_lanes(m.cols, target)
        if lanes == 0:
            self._whole_rows(sch, m, target, norm)
            return
        rows = m.row_dims
        max_block = sch.get_sblock(m.max_block)
        sum_block = sch.get_sblock(m.sum_block)
        max_rfs = tree_rfactor(sch, max_block, lanes, rows)
        sum_rfs = tree_rfactor(sch, sum_block, lanes, rows)
        for block in [max_block, *max_rfs, sum_block, *sum_rfs]:
            iters_row_red_lanes(sch, block, rows)

        norm_block = sch.get_sblock(m.norm_block)
        for _ in range(m.copies):  # relax's copies to the output: the norm block writes it
            sch.reverse_compute_inline(sch.get_consumers(norm_block)[0])
        *leading, i, j = sch.get_loops(norm_block)
        r0, r1, _ = self.split(sch, "rows", i)
        # more row dimensions (relax's [batch, heads, rows, cols]): the outer ones run in
        # parallel with r0 (splitting a fused row loop would leave bindings tensorize rejects)
        sch.parallel(fuse(sch, *leading, r0) if leading else r0)
        # consumers first: each block moves under r1 after everything that reads it
        for block in [sum_block, *sum_rfs, sch.get_sblock(m.exp_block), max_block, *max_rfs]:
            sch.compute_at(block, r1, preserve_unit_loops=True)

        _, j1 = sch.split(j, [None, lanes])
        if norm == "reciprocal":
            sch.tensorize(j1, use(DIV_BCAST_F32.format(lanes=lanes)))
        else:
            sch.vectorize(j1)
        exp_block = sch.get_sblock(m.exp_block)
        _, e1 = sch.split(sch.get_loops(exp_block)[-1], [None, lanes])
        sch.tensorize(e1, use(EXP_SUB_F32.format(lanes=lanes)))
        for stage, rf in enumerate([*max_rfs, *sum_rfs]):
            # loops under r1: row, reduced, one per lane bit (stage s of a chain has s + 1 bits)
            n_bits = stage % len(max_rfs) + 1
            lane = fuse(sch, *sch.get_loops(rf)[-n_bits:])
            sch.vectorize(lane)
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit",
                     self.sample(sch, "unroll"))

    def _whole_rows(self, sch: Schedule, m: SoftmaxMatch, target: Target, norm: str) -> None:
        """The schedule for rows no vector width divides: the same parallel row loop, one row
        per step (the rows knob's r1 x r2), each step's four blocks tensorized over the row."""
        lanes, n = vector_lanes(target, 32), m.cols
        norm_block = sch.get_sblock(m.norm_block)
        for _ in range(m.copies):
            sch.reverse_compute_inline(sch.get_consumers(norm_block)[0])
        *leading, i, j = sch.get_loops(norm_block)
        r0, r1, r2 = self.split(sch, "rows", i)
        sch.parallel(fuse(sch, *leading, r0) if leading else r0)
        # several rows under one loop fail tensorize's buffer matching
        row = fuse(sch, r1, r2)
        for name in (m.sum_block, m.exp_block, m.max_block):
            sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        how = "recip" if norm == "reciprocal" else "div"
        sch.tensorize(j, use(ROW_DIV.format(how=how, lanes=lanes, n=n)))
        for name, intrin in ((m.exp_block, ROW_EXP_SUB), (m.max_block, ROW_MAX),
                             (m.sum_block, ROW_SUM)):
            loop = sch.get_loops(sch.get_sblock(name))[-1]
            sch.tensorize(loop, use(intrin.format(lanes=lanes, n=n)))
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit",
                     self.sample(sch, "unroll"))

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        return {ms.mutator.MutateTileSize(): 0.8, ms.mutator.MutateUnroll(): 0.2}
