"""A scheduled program split into its weight packing and its kernel, as relax's pipeline splits it.

Templates (and MetaSchedule's RewriteLayout) put blocks marked
`meta_schedule.layout_rewrite_preproc` in front of the kernel: each packs a layout-free weight
(a model constant) into the layout the kernel reads. A compiled model runs them once, at compile
time (`SplitLayoutRewritePreproc` then `FoldConstant`); the kernel takes the packed weight.

- `split`: that split, by relax's own pass, of one PrimFunc wrapped in a one-call relax function;
- `kernel`: the kernel alone, which is what a measurer times;
- `mark_padded`: a relax module's padded packings marked for relax's split (tunefarm's pipeline).

A weight padded to whole vectors (`gemm-x86` with N off the 16-lane grid) is packed by
`P[...] = if_then_else(j < N, W[k, j], 0)`, no plain copy. Relax's split takes it; TVM's
`RemoveWeightLayoutRewriteBlock` does not, and MetaSchedule runs that pass on every candidate of
its search (`ArgInfo::FromEntryFunc`), so the template marks such a block `PADDED_PREPROC`
instead: MetaSchedule sees it as part of the kernel (its search, its features), tunefarm's split
and pipeline as compile-time packing. A pipeline of relax's own (`MetaScheduleApplyDatabase`,
`SplitLayoutRewritePreproc`) leaves it in the kernel, run on every call.
"""

from __future__ import annotations

from typing import Any, cast

from tuner.core import tvm_api as tv

PREPROC = "meta_schedule.layout_rewrite_preproc"
PADDED_PREPROC = "tunefarm.padded_layout_rewrite_preproc"

# (callee name, its arguments, the var bound to its result); an argument is a var, or
# (var, i) for output i of a call with several (MetaSchedule may pack two weights in one)
Step = tuple[str, list[Any], Any]


def split(func: tv.PrimFunc, arg_specs: list[tuple[str, tuple[int, ...], str]],
          n_inputs: int) -> tuple[tv.IRModule, list[Step], tv.relax.Var]:
    """(the split IRModule, its call steps in order, the returned var) for the PrimFunc `func`
    whose parameters are `arg_specs` (name, shape, dtype), the first `n_inputs` inputs. Without
    a layout-rewrite block there is one step: the function itself. Padded packings are split too
    (`PADDED_PREPROC`)."""
    relax = tv.tvm.relax
    func = _marked(func)
    bb = relax.BlockBuilder()
    params = [relax.Var(name, tv.tensor_type(shape, dt))
              for name, shape, dt in arg_specs[:n_inputs]]
    with bb.function("main", params):
        gv = bb.add_func(func.without_attr("global_symbol"), "kernel")
        outs = [tv.tensor_type(shape, dt) for _, shape, dt in arg_specs[n_inputs:]]
        res = bb.emit(relax.call_tir(gv, params,  # type: ignore[arg-type]
                                     outs[0] if len(outs) == 1 else outs))
        bb.emit_func_output(res)
    mod = relax.transform.SplitLayoutRewritePreproc()(bb.get())
    main = mod["main"]
    call_tir = tv.tvm.ir.Op.get("relax.call_tir")
    steps: list[Step] = []
    alias: dict[Any, Any] = {}
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.same_as(call_tir):
                args = [alias.get(a, a) for a in cast(tv.relax.Tuple, v.args[1]).fields]
                steps.append((cast(tv.relax.GlobalVar, v.args[0]).name_hint, args, b.var))
            elif isinstance(v, relax.Var):
                alias[b.var] = alias.get(v, v)
            elif isinstance(v, relax.TupleGetItem):  # one of a packing's several outputs
                alias[b.var] = (alias.get(v.tuple_value, v.tuple_value), int(v.index))
            else:
                raise RuntimeError(f"unexpected binding after SplitLayoutRewritePreproc: {v}")
    ret = main.body.body
    ret = alias.get(ret, ret)
    if not steps or not steps[-1][2].same_as(ret):
        raise RuntimeError("the split program does not end with the kernel call")
    return mod, steps, ret


def kernel(mod: tv.IRModule) -> tv.IRModule:
    """The IRModule of `mod`'s kernel alone ("main"): its weight-packing blocks dropped and each
    packed weight taken as a parameter in place of the weight. `mod` as it is without them."""
    sch = tv.Schedule(mod)
    blocks = [cast(tv.SBlock, sch.get(b)) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if not any(PADDED_PREPROC in b.annotations for b in blocks):
        return tv.strip_layout_rewrite(mod)  # TVM's pass: plain copies
    func = mod["main"]
    params = list(func.params)
    written = [any(w.source.same_as(p) for b in blocks for w in b.writes) for p in params]
    n_in = written.index(True) if any(written) else len(params)
    if not all(written[n_in:]):
        raise ValueError("a kernel whose outputs are not its last parameters")
    specs = [(p.name, tuple(int(d) for d in p.shape), str(p.dtype)) for p in params]
    split_mod, steps, _ = split(func, specs, n_in)
    return tv.tvm.IRModule({"main": split_mod[steps[-1][0]].with_attr("global_symbol", "main")})


def mark_padded(mod: tv.IRModule) -> tv.IRModule:
    """The relax module `mod` (schedules applied) with the padded packings of its PrimFuncs
    marked `meta_schedule.layout_rewrite_preproc`, for relax's `SplitLayoutRewritePreproc`."""
    for gv, func in list(tv.module_functions(mod).items()):
        if isinstance(func, tv.tvm.tirx.PrimFunc):
            marked = _marked(func)
            if not marked.same_as(func):
                mod.update_func(gv, marked)
    return mod


def _marked(func: tv.PrimFunc) -> tv.PrimFunc:
    """`func` with its `PADDED_PREPROC` blocks marked as MetaSchedule's packing blocks."""
    sch = tv.Schedule(tv.tvm.IRModule({"main": func}))
    padded = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if PADDED_PREPROC in cast(tv.SBlock, sch.get(b)).annotations]
    for b in padded:
        sch.unannotate(b, PADDED_PREPROC)
        sch.annotate(b, PREPROC, True)
    return sch.mod["main"] if padded else func
