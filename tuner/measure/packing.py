"""Weights packed apart from the kernel, as a compiled model packs them.

A template (and MetaSchedule's RewriteLayout) puts blocks marked
`meta_schedule.layout_rewrite_preproc` in front of the kernel: each copies a layout-free weight
into the layout the kernel reads. Measurers time the kernel without them, on weights packed
beforehand. To verify such a kernel, `tuner.core.prepack.split` separates the program the way
relax's
own pipeline does (`SplitLayoutRewritePreproc`): the packing functions, then the kernel.
`Packer` compiles each packing function once per process (the candidates of a template share
them: its layouts never depend on a sampled knob) and keeps what it packed, so a candidate is
verified with the very binary that was timed, on weights packed once, with no second build of
the whole program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tuner.core.tvm_api import IRModule, PrimFunc, RuntimeModule, Target, Tensor, tvm


def compile_function(func: PrimFunc, target: Target) -> RuntimeModule:
    """One PrimFunc of a split program, compiled on its own as "main"."""
    from tuner.core import tvm_api as tv

    return tv.compile_module(tv.tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                             target)


class Packer:
    """The kernel inputs of one workload's candidates (its inputs, packed weights in place of the
    weights), each packing compiled and run once, its output kept (`_packing_of`)."""

    def __init__(self, inputs: list[np.ndarray],
                 arg_specs: list[tuple[str, tuple[int, ...], str]]) -> None:
        self.inputs = inputs
        self.arg_specs = arg_specs
        # (target, the inputs read, `_packing_of` the function) -> the packed array
        self._packed: dict[tuple[str, tuple[int, ...], tuple[object, ...]], np.ndarray] = {}

    def kernel_inputs(self, sched_mod: IRModule, target: Target,
                      dev: tvm.runtime.Device) -> list[Tensor]:
        """The inputs of the kernel that `tuner.core.prepack.kernel(sched_mod)` compiles to, on
        `dev`: the workload's inputs with each layout-free weight packed as `sched_mod`'s
        layout-rewrite blocks pack it."""
        from tuner.core import tvm_api as tv
        from tuner.core.prepack import split

        mod, steps, _ = split(sched_mod["main"], self.arg_specs, len(self.inputs))
        params = list(mod["main"].params)
        values: dict[Any, Any] = {p: tv.tvm.runtime.tensor(x, dev)
                                  for p, x in zip(params, self.inputs, strict=True)}
        for callee, args, var in steps[:-1]:
            func = mod[callee]
            if len(func.params) != len(args) + 1 or not all(
                    any(a.same_as(p) for p in params) for a in args):
                raise RuntimeError(f"{callee}: expected a function of the inputs with one output")
            # the same packing of the same inputs: two weights may share a packing function
            reads = tuple(next(i for i, p in enumerate(params) if a.same_as(p)) for a in args)
            key = (str(target), reads, _packing_of(func))
            if key not in self._packed:
                out = func.params[-1]
                # zeros: a padded packed layout may hold elements the packing never writes
                packed = tv.tvm.runtime.tensor(
                    np.zeros(tuple(int(d) for d in out.shape), str(out.dtype)), dev)
                compile_function(func, target)["main"](*[values[a] for a in args], packed)
                self._packed[key] = packed.numpy()
            # a fresh copy each time: nothing a kernel does to its inputs outlives its check
            values[var] = tv.tvm.runtime.tensor(self._packed[key], dev)
        return [values[a] for a in steps[-1][1]]


def _packing_of(func: PrimFunc) -> tuple[object, ...]:
    """What a packing function computes, whatever its loops: its parameters and the structural
    hashes of its blocks (their iteration domains and bodies). The postprocessors parallelize and
    unroll the loops around a packing block differently from one candidate to the next; the
    copy it makes is the same."""
    from tuner.core import tvm_api as tv

    sch = tv.Schedule(tv.tvm.IRModule({"main": func.without_attr("global_symbol")}))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    specs = tuple((tuple(tv.const_shape(p)), str(tv.buffer_dtype(p)))
                  for p in tv.func_params(func))
    return (specs, *(tv.structural_hash(sch.get(b)) for b in blocks))
