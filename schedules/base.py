"""Expert templates: a template is a schedule function over a `tvm.s_tir.Schedule` whose knobs
are sampling instructions (`sample_perfect_tile`, `sample_categorical`, ...). A sampled trace is a
configuration; the trace JSON is what the database stores and what any worker replays.

A template becomes a MetaSchedule `ScheduleFn` space: the evolutionary search samples its knobs,
mutates the tile decisions, and the same postprocessors as the generated space finish the program.

Each knob is declared once, in the template's `KNOBS` table (schedules/knobs.py): `schedule`
samples from it and `knobs()` renders it. A template module imports this module (and the knob
records, the intrinsics, `tuner.core.tvm_api`), never the registry: the one list of templates is
`schedules/families.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from itertools import product
from typing import Any, ClassVar, cast

from schedules import naming
from schedules.knobs import (
    Categorical,
    DesignSpace,
    Fixed,
    Knob,
    PerfectTile,
    RegisterTile,
    knob_table,
    uniform,
)
from tuner.core.prepack import PADDED_PREPROC, PREPROC
from tuner.core.tvm_api import (
    Expr,
    ExprRV,
    IndexMap,
    LoopRV,
    SBlock,
    SBlockRV,
    Schedule,
    Target,
    fuse,
    ms,
    split_loop,
    tvm,
)
from tuner.workloads import Workload


def cpu_postprocs(*, tensorize: bool = False) -> list[ms.postproc.Postproc]:
    procs = [ms.postproc.DisallowDynamicLoop(), ms.postproc.RewriteParallelVectorizeUnroll(),
             ms.postproc.RewriteReductionBlock()]
    if tensorize:
        procs.append(ms.postproc.RewriteTensorize(vectorize_init_loop=True))
    return procs


def cpu_mutators() -> dict[ms.mutator.Mutator, float]:
    return {ms.mutator.MutateTileSize(): 0.9, ms.mutator.MutateUnroll(): 0.08,
            ms.mutator.MutateParallel(max_jobs_per_core=16): 0.02}


def is_x86(target: Target) -> bool:
    """An LLVM target for this kind of CPU (x86-64)."""
    triple = str(target.attrs.get("mtriple", "") or "")
    return target.kind.name == "llvm" and (triple == "" or triple.startswith("x86_64"))


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """SIMD lanes of `dtype_bits` elements: 16 fp32 with AVX-512, 8 with AVX2, 4 otherwise."""
    from tuner.core.tvm_api import tvm_ffi

    has = tvm_ffi.get_global_func("target.llvm_cpu_has_feature")
    if has("avx512f", target):
        width = 512
    elif has("avx2", target):
        width = 256
    else:
        width = 128
    return width // dtype_bits


def pack_weight(sch: Schedule, blk: SBlockRV, index: int,
                index_map: IndexMap | Callable[..., tuple[Expr, ...]],
                padded: SBlockRV | None = None) -> SBlockRV:
    """Read buffer `index` of `blk` (a layout-free weight) through a packed copy in the layout
    `index_map`, marked as layout-rewrite preprocessing: paid once at compile time, the timed
    kernel takes the weight packed. `padded`: the block padding that weight with zeros
    (`padding_of`), folded into the packing, which is then no plain copy: TVM's
    RemoveWeightLayoutRewriteBlock (inside MetaSchedule's search) takes only those, relax's
    split takes it, so it is marked for tunefarm's split (`tuner.core.prepack`), and runs in
    parallel
    over its outer loop where it stays in the kernel (a pipeline without that split)."""
    packed = sch.cache_read(blk, index, "global")
    sch.transform_layout(blk, ("read", index), index_map)
    if padded is None:
        sch.annotate(packed, PREPROC, True)
    else:
        sch.compute_inline(padded)
        sch.annotate(packed, PADDED_PREPROC, True)
        sch.parallel(sch.get_loops(packed)[0])
    return packed


def padding_of(sch: Schedule, blk: SBlockRV, index: int) -> SBlockRV:
    """The block writing read buffer `index` of `blk`: after `pad_einsum`, the one padding it."""
    buf = cast(SBlock, sch.get(blk)).reads[index].source
    return next(p for p in sch.get_producers(blk)
                if cast(SBlock, sch.get(p)).writes[0].source.same_as(buf))


def fold_epilogue(sch: Schedule, blocks: list[SBlockRV]) -> SBlockRV | None:
    """Elementwise blocks after a compute block folded into one: each but the last inlined into
    its consumers. The last (or None without any) is for `finish_register_tile`."""
    for b in blocks[:-1]:
        sch.compute_inline(b)
    return blocks[-1] if blocks else None


def finish_register_tile(sch: Schedule, blk: SBlockRV, *, parallel: list[LoopRV], acc_at: LoopRV,
                         unrolled: list[LoopRV], vector: LoopRV | None, k0: LoopRV, lanes: int,
                         epilogue: SBlockRV | None = None) -> None:
    """The register-blocked micro-kernel's epilogue shared by the GEMM-like templates: a local
    accumulator written back at `acc_at` (through the elementwise `epilogue` block, inlined into
    the write-back: bias, activation, ... cost no pass over memory), the outer tiles fused and
    parallel, the micro-kernel unrolled (and vectorized), then the reduction split into init +
    update with both the init and the write-back vectorized (vectorize/parallel must precede
    decompose_reduction)."""
    acc = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(acc, acc_at, preserve_unit_loops=True)
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    sch.parallel(fuse(sch, *parallel))
    for loop in unrolled:
        sch.unroll(loop)
    if vector is not None:
        sch.vectorize(vector)
    init = sch.decompose_reduction(blk, k0)
    sch.vectorize(sch.get_loops(init)[-1])
    _, wl = sch.split(sch.get_loops(acc)[-1], [None, lanes])
    sch.vectorize(wl)


class Template(ABC):
    """One family of expert schedules. Subclasses set `name`, `ops`, `description` and `KNOBS`
    (every knob, declared once: schedules/knobs.py) and implement `schedule`, which samples each
    knob through `sample` / `split` (never with literal candidates of its own).

    Several design spaces are made one way only: `design_variants` (by default every combination
    of the `DesignSpace` knobs, in table order, the first knob outermost) lists the keyword
    arguments of `schedule` that make each one, and `apply` / `space` schedule one copy each."""

    name: str = ""
    ops: tuple[str, ...] = ()
    description: str = ""
    target: str = ""  # the targets it serves, in words (docs/templates.md); `why_not` decides
    tensorize: bool = False
    KNOBS: ClassVar[Mapping[str, Knob]] = knob_table()
    # evolutionary search, run once per batch: each generation replays and scores (extracts the
    # features of) the whole population, the search's main cost. A template space is small next
    # to MetaSchedule's generated one (512 x 4): a smaller population evolved for two generations
    # around the measured best is enough, and leaves time for more measured batches.
    population_size: int = 128
    genetic_iters: int = 2

    def applies(self, workload: Workload, target: Target) -> bool:
        return workload.op in self.ops and is_x86(target)

    def why_not(self, workload: Workload, target: Target) -> str | None:
        """None if the template applies to `workload` on `target`, else why not (one line)."""
        if self.applies(workload, target):
            return None
        if workload.op not in self.ops:  # the families not yet matched by structure
            return f"matched by op name: serves {', '.join(self.ops)}, not {workload.op}"
        return "its dtype, shape divisibility or target features do not hold here"

    @abstractmethod
    def schedule(self, sch: Schedule, workload: Workload, target: Target, *args: Any,
                 **variant: Any) -> None:
        """Schedule `sch` (a fresh Schedule of `workload.mod()`) in place as ONE design space,
        sampling every knob; `variant` is one entry of `design_variants(workload)`, passed by
        keyword (`*args` is never passed: it lets a subclass name its variant's keywords)."""

    # --- the knob table -------------------------------------------------------------------------

    def sample(self, sch: Schedule, name: str, *, extent: int | None = None) -> ExprRV:
        """Sample the categorical knob `name` (one `SampleCategorical`): its declared choices and
        probabilities, or, for a knob with a `fits` rule, those that fit `extent`."""
        knob = self.KNOBS[name]
        assert isinstance(knob, Categorical), f"{self.name}: {name} is not categorical"
        assert knob.fits is None or extent is not None, f"{self.name}: {name} needs an extent"
        cands, probs = knob.distribution(extent)
        naming.note(name)
        return sch.sample_categorical(candidates=cands, probs=probs)

    def tile(self, sch: Schedule, name: str, loop: LoopRV) -> list[ExprRV]:
        """The decisions (one `SamplePerfectTile`) of the perfect-tile knob `name` over `loop`."""
        knob = self.KNOBS[name]
        assert isinstance(knob, PerfectTile), f"{self.name}: {name} is not a perfect tile"
        inner = knob.max_innermost
        if inner is None:
            inner = int(cast(tvm.tirx.IntImm, cast(tvm.tirx.For, sch.get(loop)).extent))
        naming.note(name)
        return list(sch.sample_perfect_tile(loop, n=knob.parts, max_innermost_factor=inner))

    def split(self, sch: Schedule, name: str, loop: LoopRV, *, narrow: bool = False,
              partial: bool = True) -> list[LoopRV]:
        """`loop` split by the knob `name`: a perfect tile, or [outer, inner] for a register tile
        (its inner extent one `SampleCategorical` among the choices for the loop's extent; with
        `narrow`, those for a target with 16 vector registers; `partial=False`: divisors only)."""
        knob = self.KNOBS[name]
        if isinstance(knob, RegisterTile):
            cands = knob.choices(
                int(cast(tvm.tirx.IntImm, cast(tvm.tirx.For, sch.get(loop)).extent)),
                narrow=narrow, partial=partial)
            naming.note(name)
            v = sch.sample_categorical(candidates=cands, probs=uniform(len(cands)))
            return list(sch.split(loop, [None, v]))
        return list(split_loop(sch, loop, self.tile(sch, name, loop)))

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        """The extents a knob's values depend on, for `workload` (rendered by `knobs`)."""
        return {}

    def partial_tiles(self, workload: Workload) -> bool:
        """Whether a `RegisterTile` knob with `narrow_any` may leave a partial last tile in
        `workload` (the `partial` of `split`): False where the template cannot guard one."""
        return True

    def knobs(self, workload: Workload | None = None) -> dict[str, dict[str, Any]]:
        """The knob table as JSON; with a workload, the values that apply to it."""
        extents = {} if workload is None else self.knob_extents(workload)
        variants = None if workload is None else self.design_variants(workload)
        out: dict[str, dict[str, Any]] = {}
        for name, knob in self.KNOBS.items():
            if isinstance(knob, DesignSpace):
                out[name] = knob.render(None if variants is None else
                                        list(dict.fromkeys(v[name] for v in variants)))
            elif isinstance(knob, Fixed):
                out[name] = knob.render()
            elif isinstance(knob, RegisterTile):
                out[name] = knob.render(extents.get(name), partial=workload is None
                                        or self.partial_tiles(workload))
            else:
                out[name] = knob.render(extents.get(name))
        return out

    # --- design spaces --------------------------------------------------------------------------

    def design_variants(self, workload: Workload) -> list[dict[str, Any]]:
        """Keyword arguments of `schedule` that each make one design space (structural choices
        replay cannot change): every combination of the `DesignSpace` knobs; [{}] without any."""
        spaces = {n: k.choices for n, k in self.KNOBS.items() if isinstance(k, DesignSpace)}
        return [dict(zip(spaces, combo, strict=True)) for combo in product(*spaces.values())]

    def apply(self, sch: Schedule, workload: Workload, target: Target,
              **variant: Any) -> list[Schedule]:
        """The design spaces of `workload` scheduled from `sch` (a fresh Schedule of
        `workload.mod()`), one per `design_variants(workload)` entry, in that order: the first is
        `sch` itself, scheduled in place, the others copies of it. With `variant` (one entry's
        keyword arguments): that design space alone, in `sch`."""
        if variant:
            naming.begin_space()
            self.schedule(sch, workload, target, **variant)
            return [sch]
        variants = self.design_variants(workload)
        spaces = [sch, *(sch.copy() for _ in variants[1:])]
        for s, kw in zip(spaces, variants, strict=True):
            naming.begin_space()
            self.schedule(s, workload, target, **kw)
        return spaces

    def postprocs(self, target: Target) -> list[ms.postproc.Postproc]:
        return cpu_postprocs(tensorize=self.tensorize)

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        return cpu_mutators()

    def space(self, workload: Workload, target: Target) -> ms.space_generator.ScheduleFn:
        def sch_fn(sch: Schedule) -> list[Schedule]:
            return self.apply(sch, workload, target)

        return ms.space_generator.ScheduleFn(sch_fn, sch_rules=[], postprocs=self.postprocs(target),
                                             mutator_probs=self.mutators(target))

    def describe(self, workload: Workload | None = None) -> dict[str, Any]:
        return {"name": self.name, "kind": "template", "ops": list(self.ops),
                "description": self.description, "knobs": self.knobs(workload)}


class StructuralTemplate(Template):
    """A template matched by the structure of a PrimFunc's blocks (schedules/match*.py), not by
    op name: `why_not` decides, and `applies` follows from it."""

    def applies(self, workload: Workload, target: Target) -> bool:
        return self.why_not(workload, target) is None

    @abstractmethod
    def why_not(self, workload: Workload, target: Target) -> str | None:
        """None if the template serves `workload` on `target`, else why not (one line)."""
