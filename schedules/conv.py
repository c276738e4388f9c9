"""Convolution family on x86 with AVX-512 (fp32): conv2d NCHW / NHWC, depthwise_conv2d NCHW.

- conv2d (both layouts): the NCHWc-style direct convolution. The kernel (a layout-free model
  constant) is packed by a `meta_schedule.layout_rewrite_preproc` block into output-channel blocks
  of 16 (one zmm of fp32): NCHW [O,C,KH,KW] -> [O/16, C, KH, KW, 16], NHWC [KH,KW,C,O] ->
  [O/16, KH, KW, C, 16]; the packing is paid once at compile time (the timed kernel takes the
  packed weight). The micro-kernel keeps an (ow x ocv*16) accumulator tile in registers: one
  broadcast input element per output column times ocv zmm kernel vectors per reduction step,
  the reduction runs over C (blocked) and KH, KW, and the tile is written back after it (NCHW: a
  scatter of the register tile into the channel planes; NHWC: contiguous vector stores).
  Parallel over (batch, outer oc blocks, outer output rows).
- depthwise_conv2d (NCHW): vectorized along the output width (contiguous in NCHW), an
  (oh x ow-vectors) accumulator tile, KH x KW unrolled, parallel over (batch, channel, rows).

Knobs are sampling instructions (tile sizes, unroll depth); structural choices (where the padded
input is computed, the order of the reduction loops) are design-space variants: the space holds
one design space per variant and the search samples and mutates the tiles of each. A layout never
depends on a sampled knob: the search replays traces with new decisions for sampling
instructions, but `transform_layout` replays with the index map recorded at generation time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedules.base import Template, is_x86
from schedules.registry import register
from tuner.tvm_api import ms

LANES = 16  # fp32 lanes of a zmm register: the fixed output-channel block of the packed kernel
UNROLL = ([0, 16, 64, 512], [0.1, 0.3, 0.3, 0.3])


def _pack_kernel(sch: Any, blk: Any, index: int, index_map: Callable[..., Any]) -> Any:
    """Read buffer `index` of `blk` through a packed copy (layout `index_map`), marked as
    layout-rewrite preprocessing (stripped from the timed kernel, weights given pre-packed)."""
    packed = sch.cache_read(blk, index, "global")
    sch.transform_layout(blk, ("read", index), index_map)
    sch.annotate(packed, "meta_schedule.layout_rewrite_preproc", True)
    return packed


def _sample_unroll(sch: Any) -> None:
    cands, probs = UNROLL
    v = sch.sample_categorical(candidates=cands, probs=probs)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", v)


def _tile(sch: Any, loop: Any, n: int, max_inner: int) -> list[Any]:
    return list(sch.split(loop, sch.sample_perfect_tile(loop, n=n, max_innermost_factor=max_inner)))


class _Variants(Template):
    """A template whose `apply` returns one schedule per structural variant (design spaces)."""

    def space(self, workload: Any, target: Any) -> Any:
        def sch_fn(sch: Any) -> list[Any]:
            return self.apply(sch, workload, target)

        return ms.space_generator.ScheduleFn(sch_fn, sch_rules=[], postprocs=self.postprocs(target),
                                             mutator_probs=self.mutators(target))


def _float32_x86(workload: Any, target: Any, ops: tuple[str, ...]) -> bool:
    return workload.op in ops and is_x86(target) and workload.spec.get("dtype") == "float32"


# --- conv2d ----------------------------------------------------------------------------------

PAD_MODES = ("inline", "tile", "row")
RED_ORDERS = ("c-outer", "tap-outer")


def _conv_knobs(layout: str) -> dict[str, dict[str, Any]]:
    return {
        "tile_oc": {"kind": "perfect_tile", "parts": 3, "max_innermost": 2, "of": "O/16",
                    "doc": "output-channel blocks of 16 split into [parallel, in-task, ocv]; "
                           "ocv zmm vectors of accumulators per output column"},
        "tile_oh": {"kind": "perfect_tile", "parts": 2, "max_innermost": 8,
                    "doc": "output rows split into [parallel, in-task]"},
        "tile_ow": {"kind": "perfect_tile", "parts": 2, "max_innermost": 14,
                    "doc": "output columns split into [outer, register tile]"},
        "tile_c": {"kind": "perfect_tile", "parts": 2, "max_innermost": 64,
                   "doc": "input channels split into [outer, inner] reduction loops"},
        "pad": {"kind": "design_space", "choices": list(PAD_MODES),
                "doc": "padded input: inlined into the convolution, computed per register tile "
                       "(all channels, the tile's window), or per parallel task (its rows)"},
        "order": {"kind": "design_space", "choices": list(RED_ORDERS),
                  "doc": "reduction order: c-outer = [c0, c1, kh, kw], tap-outer = [c0, kh, kw, c1]"
                         if layout == "NCHW" else
                         "reduction order: c-outer = [c0, kh, kw, c1], tap-outer = [kh, kw, c0, c1]"},
        "unroll": {"kind": "categorical", "choices": UNROLL[0],
                   "doc": "explicit unroll depth (meta_schedule.unroll_explicit)"},
    }


class _Conv2dX86(_Variants):
    ops = ("conv2d",)
    layout = "NCHW"

    def applies(self, workload: Any, target: Any) -> bool:
        return (_float32_x86(workload, target, self.ops)
                and workload.spec.get("layout") == self.layout
                and workload.spec["shape"][4] % LANES == 0)

    def knobs(self, workload: Any | None = None) -> dict[str, dict[str, Any]]:
        return _conv_knobs(self.layout)

    def apply(self, sch: Any, workload: Any, target: Any) -> list[Any]:
        nchw = self.layout == "NCHW"
        conv = sch.get_sblock("conv2d_nchw" if nchw else "conv2d_nhwc")
        if nchw:
            _pack_kernel(sch, conv, 1, lambda o, c, kh, kw: (o // LANES, c, kh, kw, o % LANES))
        else:
            _pack_kernel(sch, conv, 1, lambda kh, kw, c, o: (o // LANES, kh, kw, c, o % LANES))
        _sample_unroll(sch)
        spaces = []
        for pad in PAD_MODES:
            for order in RED_ORDERS:
                s = sch.copy()
                self._schedule(s, conv, pad, order)
                spaces.append(s)
        return spaces

    def _schedule(self, sch: Any, conv: Any, pad: str, order: str) -> None:
        if self.layout == "NCHW":
            n, o, oh, ow, rc, rh, rw = sch.get_loops(conv)
        else:
            n, oh, ow, o, rh, rw, rc = sch.get_loops(conv)
        ob, ol = sch.split(o, [None, LANES])
        ob0, ob1, ob2 = _tile(sch, ob, 3, 2)
        oh0, oh1 = _tile(sch, oh, 2, 8)
        ow0, ow1 = _tile(sch, ow, 2, 14)
        rc0, rc1 = _tile(sch, rc, 2, 64)
        if self.layout == "NCHW":
            red = [rc0, rc1, rh, rw] if order == "c-outer" else [rc0, rh, rw, rc1]
        else:
            red = [rc0, rh, rw, rc1] if order == "c-outer" else [rh, rw, rc0, rc1]
        sch.reorder(n, ob0, oh0, oh1, ob1, ow0, *red, ow1, ob2, ol)
        par = sch.fuse(n, ob0, oh0)
        acc = sch.cache_write(conv, 0, "local")
        if self.layout == "NCHW":
            # the register tile is (ow x 16 output channels): channels innermost in the
            # accumulator too, so that every lane vector is one contiguous (register) value
            sch.transform_layout(conv, ("write", 0),
                                 lambda b, o, h, w: (b, o // LANES, h, w, o % LANES))
        sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
        producers = sch.get_producers(conv)
        padb = [b for b in producers if sch.get(b).name_hint == "pad_temp"]
        if padb:
            if pad == "inline":
                sch.compute_inline(padb[0])
            else:
                sch.compute_at(padb[0], ow0 if pad == "tile" else par, preserve_unit_loops=True)
        sch.parallel(par)
        sch.unroll(ow1)
        sch.unroll(ob2)
        sch.vectorize(ol)
        init = sch.decompose_reduction(conv, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
        wb = sch.get_loops(acc)
        if self.layout == "NCHW":
            sch.unroll(wb[-1])  # ow, contiguous in the output
        else:
            sch.vectorize(wb[-1])  # ocv*16 output channels, contiguous in the output


@register
class Conv2dNCHWcX86(_Conv2dX86):
    name = "conv2d-nchwc-x86"
    layout = "NCHW"
    description = ("NCHWc direct convolution for NCHW data: kernel packed [O/16, C, KH, KW, 16] at "
                   "compile time, (ow x ocv*16) register tile, reduction over C, KH, KW, "
                   "parallel over (oc block, rows)")


@register
class Conv2dNHWCX86(_Conv2dX86):
    name = "conv2d-nhwc-x86"
    layout = "NHWC"
    description = ("NHWC direct convolution vectorized over output channels: kernel packed "
                   "[O/16, KH, KW, C, 16] at compile time, (ow x ocv*16) register tile, "
                   "parallel over (oc block, rows)")
