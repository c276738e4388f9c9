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
input is computed, the order of the reduction loops) are design-space variants: `apply` returns
one design space per variant and the search samples and mutates the tiles of each. Register
tiles are categorical knobs over the divisors that fill the micro-kernel (a random sample is
never a degenerate 1- or 2-wide tile); cache-level tiles are perfect tiles. A layout never
depends on a sampled knob: the search replays traces with new decisions for sampling
instructions, but `transform_layout` replays with the index map recorded at generation time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedules.base import Template, is_x86
from schedules.registry import register

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
    """The explicit-unroll knob, an annotation of the root block. Call it last: in TVM 0.27 a
    root-block annotation as the FIRST change of a schedule makes the next split rewrite the
    input PrimFunc in place (the workload's cached module, which every later replay starts from;
    the search then fails with "old_outputs.size() == new_outputs.size()")."""
    cands, probs = UNROLL
    v = sch.sample_categorical(candidates=cands, probs=probs)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", v)


def _tile(sch: Any, loop: Any, n: int, max_inner: int) -> list[Any]:
    """A perfect tiling of `loop` into n loops (a knob the search mutates)."""
    return list(sch.split(loop, sch.sample_perfect_tile(loop, n=n, max_innermost_factor=max_inner)))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def register_tile_choices(extent: int, lo: int, hi: int) -> list[int]:
    """Divisors of `extent` in [lo, hi] (register tiles that fill the micro-kernel), else the
    largest divisor <= hi: the tile is always perfect, whatever the shape."""
    divs = _divisors(extent)
    return [d for d in divs if lo <= d <= hi] or [max(d for d in divs if d <= hi)]


def _split_choice(sch: Any, loop: Any, choices: list[int]) -> list[Any]:
    """Split `loop` into [outer, inner] with inner sampled among `choices` (divisors of its extent):
    a categorical knob, so that random samples are never degenerate register tiles."""
    v = sch.sample_categorical(candidates=choices, probs=[1.0 / len(choices)] * len(choices))
    return list(sch.split(loop, [None, v]))


def _extent(sch: Any, loop: Any) -> int:
    return int(sch.get(loop).extent)


def _padded(workload: Any) -> bool:
    return any(int(p) > 0 for p in workload.spec.get("padding", [0, 0]))


def _float32_x86(workload: Any, target: Any, ops: tuple[str, ...]) -> bool:
    return workload.op in ops and is_x86(target) and workload.spec.get("dtype") == "float32"


# --- conv2d ----------------------------------------------------------------------------------

PAD_MODES = ("row", "tile", "inline")
RED_ORDERS = ("c-outer", "tap-outer")
OW_TILE = (4, 14)  # register tile over output columns: ow x ocv*16 accumulators (<= 28 zmm)


def _pad_modes(workload: Any) -> tuple[str, ...]:
    # without padding the "padded input" is a plain copy of the data: computing it is pure waste
    return PAD_MODES if _padded(workload) else ("inline",)


class _Conv2dX86(Template):
    ops = ("conv2d",)
    layout = "NCHW"

    def applies(self, workload: Any, target: Any) -> bool:
        return (_float32_x86(workload, target, self.ops)
                and workload.spec.get("layout") == self.layout
                and workload.spec["shape"][4] % LANES == 0)

    def knobs(self, workload: Any | None = None) -> dict[str, dict[str, Any]]:
        ow_doc = (f"output columns per register tile: the divisors of OW in [{OW_TILE[0]}, "
                  f"{OW_TILE[1]}] (else the largest divisor <= {OW_TILE[1]})")
        ow: dict[str, Any] = {"kind": "categorical", "doc": ow_doc}
        pads: list[str] = list(PAD_MODES)
        if workload is not None:
            ow_extent = workload.arg_specs()[-1][1][3 if self.layout == "NCHW" else 2]
            ow["choices"] = register_tile_choices(int(ow_extent), *OW_TILE)
            pads = list(_pad_modes(workload))
        nchw = self.layout == "NCHW"
        return {
            "tile_oc": {"kind": "perfect_tile", "parts": 3, "max_innermost": 2, "of": "O/16",
                        "doc": "output-channel blocks of 16 split into [parallel, in-task, ocv]; "
                               "ocv zmm vectors of accumulators per output column"},
            "tile_oh": {"kind": "perfect_tile", "parts": 2, "max_innermost": 8,
                        "doc": "output rows split into [parallel, in-task]"},
            "tile_ow": ow,
            "tile_c": {"kind": "perfect_tile", "parts": 2, "max_innermost": 64,
                       "doc": "input channels split into [outer, inner] reduction loops"},
            "pad": {"kind": "design_space", "choices": pads,
                    "doc": "padded input computed per parallel task (its rows, all channels), "
                           "per register tile (its window, all channels), or inlined into the "
                           "convolution; only inlined when there is no padding"},
            "order": {"kind": "design_space", "choices": list(RED_ORDERS),
                      "doc": ("reduction order: c-outer = [c0, c1, kh, kw], "
                              "tap-outer = [c0, kh, kw, c1]") if nchw else
                             ("reduction order: c-outer = [c0, kh, kw, c1], "
                              "tap-outer = [kh, kw, c0, c1]")},
            "unroll": {"kind": "categorical", "choices": UNROLL[0],
                       "doc": "explicit unroll depth (meta_schedule.unroll_explicit)"},
        }

    def apply(self, sch: Any, workload: Any, target: Any) -> list[Any]:
        nchw = self.layout == "NCHW"
        conv = sch.get_sblock("conv2d_nchw" if nchw else "conv2d_nhwc")
        if nchw:
            _pack_kernel(sch, conv, 1, lambda o, c, kh, kw: (o // LANES, c, kh, kw, o % LANES))
        else:
            _pack_kernel(sch, conv, 1, lambda kh, kw, c, o: (o // LANES, kh, kw, c, o % LANES))
        spaces = []
        for pad in _pad_modes(workload):
            for order in RED_ORDERS:
                s = sch.copy()
                self._schedule(s, conv, pad, order)
                spaces.append(s)
        return spaces

    def _schedule(self, sch: Any, conv: Any, pad: str, order: str) -> None:
        nchw = self.layout == "NCHW"
        if nchw:
            n, o, oh, ow, rc, rh, rw = sch.get_loops(conv)
        else:
            n, oh, ow, o, rh, rw, rc = sch.get_loops(conv)
        ob, ol = sch.split(o, [None, LANES])
        ob0, ob1, ob2 = _tile(sch, ob, 3, 2)
        oh0, oh1 = _tile(sch, oh, 2, 8)
        ow0, ow1 = _split_choice(sch, ow, register_tile_choices(_extent(sch, ow), *OW_TILE))
        rc0, rc1 = _tile(sch, rc, 2, 64)
        if nchw:  # the packed kernel is [O/16, C, KH, KW, 16]
            red = [rc0, rc1, rh, rw] if order == "c-outer" else [rc0, rh, rw, rc1]
        else:  # [O/16, KH, KW, C, 16]; C is also contiguous in the data
            red = [rc0, rh, rw, rc1] if order == "c-outer" else [rh, rw, rc0, rc1]
        sch.reorder(n, ob0, oh0, oh1, ob1, ow0, *red, ow1, ob2, ol)
        par = sch.fuse(n, ob0, oh0)
        acc = sch.cache_write(conv, 0, "local")
        if nchw:
            # the register tile is (ow x 16 output channels): channels innermost in the
            # accumulator too, so that each lane vector is one contiguous (register) value
            sch.transform_layout(conv, ("write", 0),
                                 lambda b, c, h, w: (b, c // LANES, h, w, c % LANES))
        sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
        padb = [b for b in sch.get_producers(conv) if sch.get(b).name_hint == "pad_temp"]
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
        if nchw:
            sch.unroll(wb[-1])  # ow: a transpose of the register tile into the channel planes
        else:
            sch.vectorize(wb[-1])  # ocv*16 output channels, contiguous in the output
        _sample_unroll(sch)


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


# --- depthwise_conv2d (NCHW) -----------------------------------------------------------------

DW_LANES = (8, 16)  # vector width along the output row (a divisor of OW)


@register
class DepthwiseNCHWX86(Template):
    name = "depthwise-nchw-x86"
    ops = ("depthwise_conv2d",)
    description = ("depthwise NCHW vectorized along the output width: (oh x ow-vectors) register "
                   "tile, KH x KW unrolled, parallel over (batch, channels, rows)")

    def applies(self, workload: Any, target: Any) -> bool:
        return _float32_x86(workload, target, self.ops) and workload.spec.get("layout") == "NCHW"

    def knobs(self, workload: Any | None = None) -> dict[str, dict[str, Any]]:
        lanes: dict[str, Any] = {
            "kind": "categorical",
            "doc": f"vector lanes along the output row: the divisors of OW in [{DW_LANES[0]}, "
                   f"{DW_LANES[1]}] (else the largest divisor <= {DW_LANES[1]})"}
        pads: list[str] = list(PAD_MODES)
        if workload is not None:
            lanes["choices"] = register_tile_choices(int(workload.arg_specs()[-1][1][3]),
                                                     *DW_LANES)
            pads = list(_pad_modes(workload))
        return {
            "tile_c": {"kind": "perfect_tile", "parts": 2, "max_innermost": 16,
                       "doc": "channels split into [parallel, in-task]"},
            "tile_oh": {"kind": "perfect_tile", "parts": 3, "max_innermost": 8,
                        "doc": "output rows split into [parallel, in-task, register rows]"},
            "lanes": lanes,
            "tile_ow": {"kind": "perfect_tile", "parts": 2, "max_innermost": 2, "of": "OW/lanes",
                        "doc": "output-row vectors split into [outer, register vectors]"},
            "pad": {"kind": "design_space", "choices": pads,
                    "doc": "padded input computed per parallel task (its channels and rows), "
                           "per register tile, or inlined; only inlined without padding"},
            "unroll": {"kind": "categorical", "choices": UNROLL[0],
                       "doc": "explicit unroll depth (meta_schedule.unroll_explicit)"},
        }

    def apply(self, sch: Any, workload: Any, target: Any) -> list[Any]:
        conv = sch.get_sblock("DepthwiseConv2d")
        spaces = []
        for pad in _pad_modes(workload):
            s = sch.copy()
            self._schedule(s, conv, pad)
            spaces.append(s)
        return spaces

    @staticmethod
    def _schedule(sch: Any, conv: Any, pad: str) -> None:
        b, c, oh, ow, rh, rw = sch.get_loops(conv)
        c0, c1 = _tile(sch, c, 2, 16)
        oh0, oh1, oh2 = _tile(sch, oh, 3, 8)
        owv, ow2 = _split_choice(sch, ow, register_tile_choices(_extent(sch, ow), *DW_LANES))
        ow0, ow1 = _tile(sch, owv, 2, 2)
        sch.reorder(b, c0, oh0, c1, oh1, ow0, rh, rw, oh2, ow1, ow2)
        par = sch.fuse(b, c0, oh0)
        acc = sch.cache_write(conv, 0, "local")
        sch.reverse_compute_at(acc, ow0, preserve_unit_loops=True)
        padb = [p for p in sch.get_producers(conv) if sch.get(p).name_hint == "PaddedInput"]
        if padb:
            if pad == "inline":
                sch.compute_inline(padb[0])
            else:
                sch.compute_at(padb[0], ow0 if pad == "tile" else par, preserve_unit_loops=True)
                sch.vectorize(sch.get_loops(padb[0])[-1])
        sch.parallel(par)
        sch.unroll(rh)
        sch.unroll(rw)
        sch.unroll(oh2)
        sch.unroll(ow1)
        sch.vectorize(ow2)
        init = sch.decompose_reduction(conv, rh)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(acc)[-1])
        _sample_unroll(sch)
