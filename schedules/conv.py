"""Convolution family on x86 (fp32; AVX-512, AVX2): conv2d NCHW / NHWC, depthwise_conv2d NCHW,
matched by structure (`schedules/match_conv.py`): the op specs, and the PrimFuncs relax makes of
a model's convolutions with their fused epilogues (bias, batch norm, residual add, relu, relu6),
which are folded into the register tile's write-back (no pass over memory of their own).

- conv2d (both layouts): the NCHWc-style direct convolution. The kernel (a layout-free model
  constant) is packed by a `meta_schedule.layout_rewrite_preproc` block into output-channel
  blocks of one vector register of fp32, L = 16 (zmm) or 8 (AVX2's ymm): NCHW [O,C,KH,KW] ->
  [O/L, C, KH, KW, L], NHWC [KH,KW,C,O] -> [O/L, KH, KW, C, L]; the packing is paid once at
  compile time (the timed kernel takes the packed weight). The micro-kernel keeps an
  (ow x ocv*16) accumulator tile in registers: one broadcast input element per output column
  times ocv*16/L kernel vectors per reduction step, the reduction runs over C (blocked) and KH,
  KW, and the tile is written back after it (NCHW: a scatter of the register tile into the
  channel planes; NHWC: contiguous vector stores). Parallel over (batch, outer oc blocks, outer
  output rows). AVX2 has 16 registers, not 32, and a 16-channel block takes two of them: there
  the tile is narrower (`OW_TILE_NARROW`), of any width (the last tile partial and peeled off;
  a divisor of OW where O is padded, below), and each register is a block of the packed kernel
  of its own (16-lane vectors split by LLVM into ymm halves measured 1.4-1.7x slower). O off the
  16 grid (MobileNetV2's and EfficientNet's 24 and 40 channels) is padded with zero filters in
  the packing, as `gemm-x86` pads N (`_pad_channels`), and the write-back is predicated.
- depthwise_conv2d (NCHW): vectorized along the output width (contiguous in NCHW), an
  (oh x ow-vectors) accumulator tile, KH x KW unrolled, parallel over (batch, channel, rows).

Knobs are sampling instructions (tile sizes, unroll depth); structural choices (where the padded
input is computed, the order of the reduction loops) are `DesignSpace` knobs: one design space per
variant (`design_variants`), and the search samples and mutates the tiles of each. Register
tiles are categorical knobs over the divisors that fill the micro-kernel (a random sample is
never a degenerate 1- or 2-wide tile); cache-level tiles are perfect tiles. A layout never
depends on a sampled knob: the search replays traces with new decisions for sampling
instructions, but `transform_layout` replays with the index map recorded at generation time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from schedules.base import (
    StructuralTemplate,
    fold_epilogue,
    is_x86,
    pack_weight,
    padding_of,
    vector_lanes,
)
from schedules.knobs import (
    Categorical,
    DesignSpace,
    Knob,
    PerfectTile,
    RegisterTile,
    knob_table,
)
from schedules.match import NoMatch
from schedules.match_conv import ConvMatch, DepthwiseMatch, match_conv, match_depthwise
from tuner.core.tvm_api import fuse, reorder
from tuner.workloads import Workload

if TYPE_CHECKING:
    from tuner.core.tvm_api import LoopRV, SBlock, SBlockRV, Schedule, Target

BLOCK = 16  # output channels per block of the register tile (knob tile_oc): one zmm of fp32
UNROLL = Categorical((0, 16, 64, 512), probs=(0.1, 0.3, 0.3, 0.3),
                     doc="explicit unroll depth (meta_schedule.unroll_explicit)")


def _pad_channels(sch: Schedule, conv: SBlockRV, o_axis: int, multiple: int) -> SBlockRV:
    """The convolution's output channels padded to a `multiple` (`pad_einsum`, which takes only
    an einsum: the data read through an im2col-like reindex, inlined back after), its kernel
    padded with zero filters by a block of its own (returned) and its output written back to
    the unpadded buffer by a copy that the epilogue folds in."""
    window = sch.reindex(conv, ("read", 0))
    factors = [1] * len(sch.get_loops(conv))
    factors[o_axis] = multiple
    sch.pad_einsum(conv, factors)
    sch.compute_inline(window)
    return padding_of(sch, conv, 1)


def _matched(workload: Workload, depthwise: bool) -> ConvMatch | DepthwiseMatch | NoMatch:
    return match_depthwise(workload) if depthwise else match_conv(workload)


def _match(workload: Workload, depthwise: bool) -> ConvMatch | DepthwiseMatch:
    m = _matched(workload, depthwise)
    assert not isinstance(m, NoMatch), m
    return m


def _pads_channels(m: ConvMatch | DepthwiseMatch) -> bool:
    """Output channels off the BLOCK grid: padded with zero filters, the write-back predicated."""
    return m.out[1] % BLOCK != 0


class _Direct(StructuralTemplate):
    """What the convolution templates share: matching by structure (`schedules/match_conv.py`),
    the explicit-unroll knob, sampled last, the placement of the padded input, a design space
    only where there is padding, and the epilogue folded into the register tile's write-back."""

    depthwise = False

    def why_not(self, workload: Workload, target: Target) -> str | None:
        m = _matched(workload, self.depthwise)
        if isinstance(m, NoMatch):
            return m.reason
        return "not an x86 LLVM target" if not is_x86(target) else self._why_not(m)

    def _why_not(self, m: ConvMatch | DepthwiseMatch) -> str | None:
        return None

    @staticmethod
    def _fold_epilogue(sch: Schedule, m: ConvMatch | DepthwiseMatch, *,
                       padded: bool = False) -> SBlockRV | None:
        """The epilogue blocks folded into one (None without any), for `_write_back`; `padded`:
        with the copy of the padded output back to the unpadded one first."""
        count = m.epilogue + padded
        if not count:
            return None
        return fold_epilogue(sch, list(sch.get_child_blocks(sch.get_sblock("root"))[-count:]))

    @staticmethod
    def _write_back(sch: Schedule, acc: SBlockRV, at: LoopRV, epilogue: SBlockRV | None) -> None:
        """The accumulator written back at loop `at`, through the folded `epilogue`."""
        sch.reverse_compute_at(acc, at, preserve_unit_loops=True)
        if epilogue is not None:
            sch.reverse_compute_inline(epilogue)

    def _sample_unroll(self, sch: Schedule) -> None:
        """The explicit-unroll knob, an annotation of the root block. Call it last: in TVM 0.27 a
        root-block annotation as the FIRST change of a schedule makes the next split rewrite the
        input PrimFunc in place (the workload's cached module, which every later replay starts
        from; the search then fails with "old_outputs.size() == new_outputs.size()")."""
        v = self.sample(sch, "unroll")  # (sampled before the root lookup: the stored order)
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", v)

    def design_variants(self, workload: Workload) -> list[dict[str, Any]]:
        # without padding the "padded input" is a plain copy of the data: computing it is pure
        # waste, so it is only inlined
        variants = super().design_variants(workload)
        padded = _match(workload, self.depthwise).padded
        return variants if padded else [v for v in variants if v["pad"] == "inline"]

    @staticmethod
    def _place_padding(sch: Schedule, padb: list[SBlockRV], pad: str, *, tile: LoopRV,
                       task: LoopRV) -> bool:
        """Inline the padded input, or compute it per register `tile` or per parallel `task`;
        True when it was computed (not inlined)."""
        if not padb:
            return False
        if pad == "inline":
            sch.compute_inline(padb[0])
            return False
        sch.compute_at(padb[0], tile if pad == "tile" else task, preserve_unit_loops=True)
        return True


# --- conv2d ----------------------------------------------------------------------------------

PAD_MODES = ("row", "tile", "inline")
RED_ORDERS = ("c-outer", "tap-outer")
OW_TILE = (4, 14)  # register tile over output columns: ow x ocv*16 accumulators (<= 28 zmm)
# with 16 registers (AVX2): ow x ocv*2 ymm accumulators (<= 14); on a Zen 5 running AVX2 code, F14
# (3x3 256->256 at 14^2, OW in {7, 14} before) went from 1.57 to 1.15 ms with 2 columns x 4 ymm
OW_TILE_NARROW = (2, 7)
# ... and there any width in that range, the last tile partial (a predicate), peeled off by
# LoopPartition (`pragma_loop_partition_hint`): F14 on a Zen 3, its best trace with 5 columns x 2
# ymm (10 accumulators) and the padded input per tile, 0.87-0.91x the 2 x 4 ymm tile it chose
# among OW's divisors; the same without the peeling 1.0x, with the input padding inlined 1.1x
# (bench/RESULTS.md Run AV). The peeled copy of the tile doubles its code: F14's builds took 2.4x
# as long on average (Run AW)


class _Conv2dX86(_Direct):
    """Matched by structure (`schedules.match_conv.match_conv`): the op spec conv2d, and relax's
    `fused_conv2d_add_relu` and kin (batch norm as subtract, divide, multiply, add; a residual
    add) sent as `tir`, whose epilogue is folded into the register tile's write-back."""

    ops = ("conv2d", "tir")
    layout = "NCHW"
    # F14 (3x3 256->256 at 14^2) on an AVX2 Zen 3, 64 trials: proposals took 13-15 s of a 57-60
    # s job at 64 against 22-25 s of 64-79 s at 128; the picks timed side by side, median 1.72
    # ms (3 seeds) against 1.76 (5). F11-F13 as close (bench/RESULTS.md Run AY)
    population_size = 64

    def _why_not(self, m: ConvMatch | DepthwiseMatch) -> str | None:
        assert isinstance(m, ConvMatch), m
        if m.layout != self.layout:
            return f"a {m.layout} convolution, not {self.layout}"
        return None

    @staticmethod
    def _knobs(order_doc: str) -> Mapping[str, Knob]:
        return knob_table(
            tile_oc=PerfectTile(3, max_innermost=2, of="O/16 (O padded to 16)",
                                doc="output-channel blocks of 16 split into [parallel, "
                                    "in-task, ocv]; ocv blocks of accumulators per "
                                    "output column (a zmm each, two ymm on AVX2)"),
            tile_oh=PerfectTile(2, max_innermost=8, doc="output rows split into [parallel, "
                                                        "in-task]"),
            tile_ow=RegisterTile(*OW_TILE, of="OW", narrow=OW_TILE_NARROW, narrow_any=True,
                                 doc="output columns per register tile"),
            tile_c=PerfectTile(2, max_innermost=64,
                               doc="input channels split into [outer, inner] reduction loops"),
            pad=DesignSpace(PAD_MODES, doc="padded input computed per parallel task (its rows, "
                                           "all channels), per register tile (its window, all "
                                           "channels), or inlined into the convolution; only "
                                           "inlined when there is no padding"),
            order=DesignSpace(RED_ORDERS, doc=order_doc),
            unroll=UNROLL,
        )

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        return {"tile_ow": _match(workload, False).out[3]}

    def partial_tiles(self, workload: Workload) -> bool:
        # not with output channels padded to BLOCK: see `schedule`
        return not _pads_channels(_match(workload, False))

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *, pad: str,
                 order: str) -> None:
        m = _match(workload, False)
        nchw = self.layout == "NCHW"
        lanes = min(vector_lanes(target, 32), BLOCK)  # L: the packed kernel's block
        conv = sch.get_sblock(m.block)
        wpad = _pad_channels(sch, conv, 1 if nchw else 3, BLOCK) if _pads_channels(m) else None
        epilogue = self._fold_epilogue(sch, m, padded=wpad is not None)
        if nchw:
            pack_weight(sch, conv, 1, lambda o, c, kh, kw: (o // lanes, c, kh, kw, o % lanes),
                         wpad)
            n, o, oh, ow, rc, rh, rw = sch.get_loops(conv)
        else:
            pack_weight(sch, conv, 1, lambda kh, kw, c, o: (o // lanes, kh, kw, c, o % lanes),
                         wpad)
            n, oh, ow, o, rh, rw, rc = sch.get_loops(conv)
        ob, ol = sch.split(o, [None, BLOCK])
        ob0, ob1, ob2 = self.split(sch, "tile_oc", ob)
        oh0, oh1 = self.split(sch, "tile_oh", oh)
        # a width that does not divide OW on AVX2: the last, partial tile peeled off. Not with
        # padded channels: in TVM 0.27 inlining the copy to the unpadded output into the
        # write-back (reverse_compute_inline) replaces the block's predicate, and the write-back
        # of the last tile would lose its column guard (out of bounds: wrong outputs, a
        # corrupted heap)
        partial = lanes < BLOCK and not _pads_channels(m)  # as `partial_tiles` says
        ow0, ow1 = self.split(sch, "tile_ow", ow, narrow=lanes < BLOCK, partial=partial)
        if partial:
            sch.annotate(ow0, "pragma_loop_partition_hint", 1)
        rc0, rc1 = self.split(sch, "tile_c", rc)
        # a block of BLOCK channels as BLOCK/L registers of L lanes (one with AVX-512)
        vec = list(sch.split(ol, [None, lanes])) if lanes < BLOCK else [ol]
        if nchw:  # the packed kernel is [O/L, C, KH, KW, L]
            red = [rc0, rc1, rh, rw] if order == "c-outer" else [rc0, rh, rw, rc1]
        else:  # [O/L, KH, KW, C, L]; C is also contiguous in the data
            red = [rc0, rh, rw, rc1] if order == "c-outer" else [rh, rw, rc0, rc1]
        reorder(sch, n, ob0, oh0, oh1, ob1, ow0, *red, ow1, ob2, *vec)
        par = fuse(sch, n, ob0, oh0)
        acc = sch.cache_write(conv, 0, "local")
        if nchw:
            # the register tile is (ow x ocv*16 output channels): channels innermost in the
            # accumulator too, in blocks of L, so that each vector is one contiguous register
            sch.transform_layout(conv, ("write", 0),
                                 lambda b, c, h, w: (b, c // lanes, h, w, c % lanes))
        self._write_back(sch, acc, ow0, epilogue)
        padb = [b for b in sch.get_producers(conv)
                if cast("SBlock", sch.get(b)).name_hint == m.pad]
        self._place_padding(sch, padb, pad, tile=ow0, task=par)
        sch.parallel(par)
        for loop in (ow1, ob2, *vec[:-1]):
            sch.unroll(loop)
        sch.vectorize(vec[-1])
        init = sch.decompose_reduction(conv, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
        wb = sch.get_loops(acc)
        if nchw:
            sch.unroll(wb[-1])  # ow: a transpose of the register tile into the channel planes
        else:
            sch.vectorize(wb[-1])  # ocv*16 output channels, contiguous in the output
        self._sample_unroll(sch)


class Conv2dNCHWcX86(_Conv2dX86):
    name = "conv2d-nchwc-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    layout = "NCHW"
    description = ("NCHWc direct convolution for NCHW data: kernel packed [O/L, C, KH, KW, L] "
                   "(L = 16, 8 on AVX2) at compile time, (ow x ocv*16) register tile, reduction "
                   "over C, KH, KW, parallel over (oc block, rows)")
    KNOBS = _Conv2dX86._knobs("reduction order: c-outer = [c0, c1, kh, kw], "
                              "tap-outer = [c0, kh, kw, c1]")


class Conv2dNHWCX86(_Conv2dX86):
    name = "conv2d-nhwc-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    layout = "NHWC"
    description = ("NHWC direct convolution vectorized over output channels: kernel packed "
                   "[O/L, KH, KW, C, L] (L = 16, 8 on AVX2) at compile time, (ow x ocv*16) "
                   "register tile, parallel over (oc block, rows)")
    KNOBS = _Conv2dX86._knobs("reduction order: c-outer = [c0, kh, kw, c1], "
                              "tap-outer = [kh, kw, c0, c1]")


# --- depthwise_conv2d (NCHW) -----------------------------------------------------------------

DW_LANES = (8, 16)  # vector width along the output row (a divisor of OW)


class DepthwiseNCHWX86(_Direct):
    """Matched by structure: the op spec depthwise_conv2d, and relax's conv2d with groups =
    channels (`fused_conv2d_multiply_add_clip`: MobileNet's depthwise + batch norm + relu6)."""

    name = "depthwise-nchw-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    ops = ("depthwise_conv2d", "tir")
    depthwise = True
    description = ("depthwise NCHW vectorized along the output width: (oh x ow-vectors) register "
                   "tile, KH x KW unrolled, parallel over (batch, channels, rows)")
    KNOBS = knob_table(
        tile_c=PerfectTile(2, max_innermost=16, doc="channels split into [parallel, in-task]"),
        tile_oh=PerfectTile(3, max_innermost=8,
                            doc="output rows split into [parallel, in-task, register rows]"),
        lanes=RegisterTile(*DW_LANES, of="OW", doc="vector lanes along the output row"),
        tile_ow=PerfectTile(2, max_innermost=2, of="OW/lanes",
                            doc="output-row vectors split into [outer, register vectors]"),
        pad=DesignSpace(PAD_MODES, doc="padded input computed per parallel task (its channels "
                                       "and rows), per register tile, or inlined; only inlined "
                                       "without padding"),
        unroll=UNROLL,
    )

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        return {"lanes": _match(workload, True).out[3]}

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *, pad: str) -> None:
        m = _match(workload, True)
        epilogue = self._fold_epilogue(sch, m)
        conv = sch.get_sblock(m.block)
        b, c, oh, ow, *red = sch.get_loops(conv)  # red: [group channel (1),] rh, rw
        rh, rw = red[-2:]
        c0, c1 = self.split(sch, "tile_c", c)
        oh0, oh1, oh2 = self.split(sch, "tile_oh", oh)
        owv, ow2 = self.split(sch, "lanes", ow)
        ow0, ow1 = self.split(sch, "tile_ow", owv)
        reorder(sch, b, c0, oh0, c1, oh1, ow0, *red, oh2, ow1, ow2)
        par = fuse(sch, b, c0, oh0)
        acc = sch.cache_write(conv, 0, "local")
        self._write_back(sch, acc, ow0, epilogue)
        padb = [p for p in sch.get_producers(conv)
                if cast("SBlock", sch.get(p)).name_hint == m.pad]
        if self._place_padding(sch, padb, pad, tile=ow0, task=par):
            sch.vectorize(sch.get_loops(padb[0])[-1])
        sch.parallel(par)
        sch.unroll(rh)
        sch.unroll(rw)
        sch.unroll(oh2)
        sch.unroll(ow1)
        sch.vectorize(ow2)
        init = sch.decompose_reduction(conv, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(acc)[-1])
        self._sample_unroll(sch)
