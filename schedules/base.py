"""Expert templates: a template is a schedule function over a `tvm.s_tir.Schedule` whose knobs
are sampling instructions (`sample_perfect_tile`, `sample_categorical`, ...). A sampled trace is a
configuration; the trace JSON is what the database stores and what any worker replays.

A template becomes a MetaSchedule `ScheduleFn` space: the evolutionary search samples its knobs,
mutates the tile decisions, and the same postprocessors as the generated space finish the program.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from tuner.tvm_api import ms


def cpu_postprocs(*, tensorize: bool = False) -> list[Any]:
    procs = [ms.postproc.DisallowDynamicLoop(), ms.postproc.RewriteParallelVectorizeUnroll(),
             ms.postproc.RewriteReductionBlock()]
    if tensorize:
        procs.append(ms.postproc.RewriteTensorize(vectorize_init_loop=True))
    return procs


def cpu_mutators() -> dict[Any, float]:
    return {ms.mutator.MutateTileSize(): 0.9, ms.mutator.MutateUnroll(): 0.08,
            ms.mutator.MutateParallel(max_jobs_per_core=16): 0.02}


def is_x86(target: Any) -> bool:
    """An LLVM target for this kind of CPU (x86-64)."""
    triple = str(target.attrs.get("mtriple", "") or "")
    return target.kind.name == "llvm" and (triple == "" or triple.startswith("x86_64"))


def vector_lanes(target: Any, dtype_bits: int = 32) -> int:
    """SIMD lanes of `dtype_bits` elements: 16 fp32 with AVX-512, 8 with AVX2, 4 otherwise."""
    from tuner.tvm_api import tvm_ffi

    has = tvm_ffi.get_global_func("target.llvm_cpu_has_feature")
    if has("avx512f", target):
        width = 512
    elif has("avx2", target):
        width = 256
    else:
        width = 128
    return width // dtype_bits


def finish_register_tile(sch: Any, blk: Any, *, parallel: list[Any], acc_at: Any,
                         unrolled: list[Any], vector: Any | None, k0: Any, lanes: int) -> None:
    """The register-blocked micro-kernel's epilogue shared by the GEMM-like templates: a local
    accumulator written back at `acc_at`, the outer tiles fused and parallel, the micro-kernel
    unrolled (and vectorized), then the reduction split into init + update with both the init and
    the write-back vectorized (vectorize/parallel must precede decompose_reduction)."""
    acc = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(acc, acc_at, preserve_unit_loops=True)
    sch.parallel(sch.fuse(*parallel))
    for loop in unrolled:
        sch.unroll(loop)
    if vector is not None:
        sch.vectorize(vector)
    init = sch.decompose_reduction(blk, k0)
    sch.vectorize(sch.get_loops(init)[-1])
    _, wl = sch.split(sch.get_loops(acc)[-1], [None, lanes])
    sch.vectorize(wl)


class Template(ABC):
    """One family of expert schedules. Subclasses set `name`, `ops`, `description`."""

    name: str = ""
    ops: tuple[str, ...] = ()
    description: str = ""
    tensorize: bool = False
    # evolutionary search, run once per batch: each generation replays and scores (extracts the
    # features of) the whole population, the search's main cost. A template space is small next
    # to MetaSchedule's generated one (512 x 4): a smaller population evolved for two generations
    # around the measured best is enough, and leaves time for more measured batches.
    population_size: int = 128
    genetic_iters: int = 2

    def applies(self, workload: Any, target: Any) -> bool:
        return workload.op in self.ops and is_x86(target)

    @abstractmethod
    def apply(self, sch: Any, workload: Any, target: Any) -> Any:
        """Schedule `sch` (a fresh Schedule of `workload.mod()`), sampling every knob. Return None
        (`sch` is the design space) or a list of schedules (several design spaces: structural
        choices such as loop orders, which replay cannot change, are separate spaces)."""

    @abstractmethod
    def knobs(self, workload: Any | None = None) -> dict[str, dict[str, Any]]:
        """Each knob: {"kind": "perfect_tile"|"categorical", "doc": ..., plus its range}."""

    def postprocs(self, target: Any) -> list[Any]:
        return cpu_postprocs(tensorize=self.tensorize)

    def mutators(self, target: Any) -> dict[Any, float]:
        return cpu_mutators()

    def design_variants(self) -> list[dict[str, Any]]:
        """Keyword arguments of `apply` that each make one design space (structural choices
        replay cannot change); empty: `apply` alone makes the space(s)."""
        return []

    def space(self, workload: Any, target: Any) -> Any:
        variants = self.design_variants()

        def sch_fn(sch: Any) -> Any:
            if not variants:
                return self.apply(sch, workload, target)
            spaces = []
            for kw in variants:
                s = sch.copy()
                self.apply(s, workload, target, **kw)
                spaces.append(s)
            return spaces

        return ms.space_generator.ScheduleFn(sch_fn, sch_rules=[], postprocs=self.postprocs(target),
                                             mutator_probs=self.mutators(target))

    def describe(self, workload: Any | None = None) -> dict[str, Any]:
        return {"name": self.name, "kind": "template", "ops": list(self.ops),
                "description": self.description, "knobs": self.knobs(workload)}
