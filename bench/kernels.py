"""A tuned schedule as a timed TVM kernel, with weight packing split off and paid once.

MetaSchedule's RewriteLayout postprocessor (and tunefarm templates that pack weights) put a
block marked `meta_schedule.layout_rewrite_preproc` in front of the kernel: it copies a
layout-free weight into the layout the kernel wants. Both tuners time candidates WITHOUT that
block (`RemoveWeightLayoutRewriteBlock`: the kernel takes the weight pre-packed, as a compiled
model with constant weights would), so the benchmark does the same, with real packed data:

1. the scheduled PrimFunc is wrapped in a one-call relax function and relax's
   `SplitLayoutRewritePreproc` (the pass TVM's own relax pipeline uses) splits it into
   `<f>_weight_prepack` PrimFuncs (the preproc blocks) and `<f>_prepacked` (the kernel);
2. every function is compiled; the prepack functions run once on the real weights;
3. the kernel is timed on (inputs, packed weights) and its output is checked against the
   workload's numpy reference, so what is timed is exactly what is verified.

Without a preproc block step 1 leaves the function as it is and nothing is packed. A packing
that reads a runtime input (a parameter outside the function's `layout_free_buffers`, e.g. both
operands of `R.matmul(a, b)`) is no compile-time work: then the whole scheduled function, its
packing included, is what is timed (`TvmKernel.packing_timed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class TvmKernel:
    rt: Any  # runtime module of the timed kernel ("main")
    args: list[Any]  # tvm tensors: kernel inputs (weights packed) then outputs
    n_out: int
    packed: list[dict[str, Any]] = field(default_factory=list)  # what was packed, for the JSON
    prepack_s: float = 0.0
    packing_timed: list[str] = field(default_factory=list)  # runtime inputs packed in the call

    def __call__(self) -> None:
        self.rt["main"](*self.args)

    def outputs(self) -> list[np.ndarray]:
        return [a.numpy() for a in self.args[-self.n_out:]]

    def zero_outputs(self) -> None:
        for a in self.args[-self.n_out:]:
            a.copyfrom(np.zeros(a.shape, a.dtype))

    def evaluator(self, number: int, min_ms: float, args: list[Any] | None = None) -> Any:
        """Seconds per call, averaged over one run of >= min_ms (TVM grows `number` if needed),
        on `args` (default: the kernel's own)."""
        from tuner.core import tvm_api as tv

        ev = self.rt.time_evaluator("main", tv.tvm.cpu(0), number=number, repeat=1,
                                    min_repeat_ms=int(np.ceil(min_ms)))
        on = self.args if args is None else args
        return lambda: float(ev(*on).mean)


def prepare(sched_mod: Any, wl: Any, inputs: list[np.ndarray], target: Any) -> TvmKernel:
    """Compile a scheduled module (a replayed best trace) into a timed kernel on `inputs`."""
    import time

    from tuner.core import tvm_api as tv
    from tuner.core.prepack import split
    from tuner.measure.packing import compile_function

    dev = tv.tvm.cpu(0)
    specs = wl.arg_specs()
    n_in = wl.num_inputs
    mod, steps, _ = split(sched_mod["main"], specs, n_in)
    main = mod["main"]
    free = _layout_free(wl.mod()["main"])
    index = {p: i for i, p in enumerate(main.params)}
    runtime = sorted({specs[index[a]][0] for _, args, _ in steps[:-1] for a in args
                      if a in index and index[a] not in free})
    if runtime:  # packing a runtime input is part of every call: time the function whole
        rt = compile_function(sched_mod["main"], target)
        outs = [tv.tvm.runtime.tensor(np.zeros(shape, dt), dev) for _, shape, dt in specs[n_in:]]
        kargs = [tv.tvm.runtime.tensor(x, dev) for x in inputs] + outs
        return TvmKernel(rt=rt, args=kargs, n_out=len(outs), packing_timed=runtime)
    values: dict[Any, Any] = {p: tv.tvm.runtime.tensor(x, dev)
                              for p, x in zip(main.params, inputs, strict=True)}
    names = {p: name for p, (name, _, _) in zip(main.params, specs[:n_in], strict=True)}
    packed: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for callee, args, var in steps[:-1]:  # weight packing: run once, not timed
        func = mod[callee]
        rt = compile_function(func, target)
        # zeros: a padded packed layout may leave elements the preproc never writes
        outs = [tv.tvm.runtime.tensor(np.zeros(tuple(int(d) for d in p.shape), str(p.dtype)), dev)
                for p in func.params[len(args):]]
        rt["main"](*[values[a] for a in args], *outs)
        values[var] = outs[0]
        values.update({(var, i): o for i, o in enumerate(outs)})  # a call with several outputs
        src = [names.get(a, "?") for a in args]
        for o in outs:
            packed.append({"function": callee, "from": src,
                           "from_shape": [list(values[a].shape) for a in args],
                           "packed_shape": list(o.shape), "dtype": str(o.dtype)})
    prepack_s = time.perf_counter() - t0
    callee, args, _ = steps[-1]
    kfunc = mod[callee]
    rt = compile_function(kfunc, target)
    out_specs = specs[n_in:]
    outs = [tv.tvm.runtime.tensor(np.zeros(shape, dt), dev) for _, shape, dt in out_specs]
    kargs = [values[a] for a in args] + outs
    if len(kargs) != len(kfunc.params):
        raise RuntimeError(f"{callee} takes {len(kfunc.params)} params, got {len(kargs)}")
    return TvmKernel(rt=rt, args=kargs, n_out=len(outs), packed=packed, prepack_s=prepack_s)


def _layout_free(func: Any) -> set[int]:
    """The parameter indices `func` declares layout-free (constant weights a compiled model packs
    once): its `layout_free_buffers` attribute."""
    attrs = func.attrs
    if attrs is None or "layout_free_buffers" not in attrs:
        return set()
    return {int(i) for i in attrs["layout_free_buffers"]}


def sched_mod_from_trace(wl: Any, trace_json: str) -> Any:
    from schedules.registry import replay

    return replay(wl.mod(), trace_json).mod


def cross_check_stripped(sched_mod: Any, kernel: TvmKernel) -> bool:
    """True when the kernel's params match what the tuners timed (`tuner.core.prepack.kernel`)."""
    from tuner.core import tvm_api as tv
    from tuner.core.prepack import kernel as kernel_of

    want = tv.param_specs(sched_mod if kernel.packing_timed else kernel_of(sched_mod))
    got = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in kernel.args]
    return want == got
