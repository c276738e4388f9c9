"""The one relax pipeline a model goes through, for extraction and for the build alike, so the
tasks tuned are exactly the PrimFuncs the build looks up:

    partition   `lowp` (`--dtype bfloat16`: linear layers on bf16 operands),
                `fixups` (what TVM cannot compile as its frontends produce it),
                `canonical` (RMS norm, conv1d, padded convolutions in the form a
                template serves),
                DecomposeOpsForInference, CanonicalizeBindings, LegalizeOps,
                AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR,
                AttachAttrLayoutFreeBuffers (weights bound as constants may be packed), and
                every gather's index clamped into its buffer (`tuner.workloads.bounds`: the
                service accepts a task only so, and the library never reads out of bounds)
    extract     MetaSchedule's task extraction; tasks computing the same thing
                (`tuner.workloads.identity`) merge, their call counts summed as the weight
    build       partition, MetaScheduleApplyDatabase with a `TunefarmDatabase`, the packing of
                constant weights split out and folded (`tuner.core.prepack.mark_padded` for
                padded packings, SplitLayoutRewritePreproc, FoldConstant), then
                `tvm.compile`. A task without a record keeps relax's default loops
                (correct, slow); `build` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.prepack import mark_padded
from ..core.tvm_api import IRModule, PrimFunc, Target, make_target, module_functions, ms, relax, tvm
from ..workloads.bounds import clamp_data_dependent
from ..workloads.identity import identity_hash
from .canonical import Conv1dAsConv2d, FoldZeroPadIntoConv, RecogniseRmsNorm
from .fastmath import FastGelu
from .fixups import BoolCompare, SmallPower
from .lowp import dtype_passes

__all__ = ["Built", "ModelTask", "apply", "build", "extract", "partition", "task_flops"]


@dataclass(frozen=True)
class ModelTask:
    """One distinct PrimFunc of a partitioned model."""

    name: str  # relax's name of the first function found (e.g. fused_matmul_add_gelu)
    func: PrimFunc  # the PrimFunc, as MetaSchedule normalizes it (global symbol "main")
    weight: int  # how many times one run of the model calls it
    identity: str  # `tuner.workloads.identity.identity_hash`: what it computes


@dataclass(frozen=True)
class Built:
    executable: tvm.runtime.Executable  # relax VM executable
    tasks: list[ModelTask]
    untuned: list[str]  # names of the tasks that had no record: relax's default loops

    @property
    def untuned_share(self) -> float:
        """The share of one run's operations (Σ calls × FLOPs) in the tasks without a record:
        how far from tuned the library is likely to be."""
        total = sum(t.weight * task_flops(t) for t in self.tasks)
        missing = sum(t.weight * task_flops(t) for t in self.tasks if t.name in self.untuned)
        return missing / total if total else 0.0


def task_flops(task: ModelTask) -> float:
    """TVM's estimate of one call's operations (at least 1: a copy counts as one)."""
    try:
        flops = float(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": task.func})))
    except Exception:  # the estimator refuses some constructs
        flops = 0.0
    return max(flops, 1.0)


def _as_target(target: Target | str | dict[str, Any]) -> Target:
    """A TVM Target from a spec ("host", a dict) or a Target."""
    return target if isinstance(target, tvm.target.Target) else make_target(target)


def partition(mod: IRModule, target: Target | str | dict[str, Any], *, fast_math: bool = False,
              dtype: str = "float32") -> IRModule:
    """The model with every operator legalized to TIR and fused into tasks; `fast_math`:
    GELU, erf and tanh as vectorizable approximations (`tuner.model.fastmath`); `dtype`
    "bfloat16": its linear layers on bf16 operands (`tuner.model.lowp`)."""
    target = _as_target(target)
    passes = [*([FastGelu()] if fast_math else []), *dtype_passes(dtype), BoolCompare(),
              RecogniseRmsNorm(), Conv1dAsConv2d(), FoldZeroPadIntoConv(), SmallPower(),
              relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings(),
              relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FoldConstant(), relax.transform.FuseOps(),
              relax.transform.FuseTIR(), relax.transform.AttachAttrLayoutFreeBuffers()]
    with target:
        mod = tvm.transform.Sequential(passes)(mod)
    for gv, func in list(module_functions(mod).items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            clamped = clamp_data_dependent(func)
            if not clamped.same_as(func):
                mod.update_func(gv, clamped)
    return mod


def extract(partitioned: IRModule, target: Target | str | dict[str, Any]) -> list[ModelTask]:
    """The distinct tasks of a partitioned model, heaviest (weight) first, then by name."""
    target = _as_target(target)
    merged: dict[str, ModelTask] = {}
    for t in ms.relax_integration.extract_tasks(partitioned, target):
        func = t.dispatched[0]["main"]
        ident = identity_hash(func)
        prev = merged.get(ident)
        merged[ident] = (ModelTask(t.task_name, func, int(t.weight), ident) if prev is None
                         else ModelTask(prev.name, prev.func, prev.weight + int(t.weight), ident))
    return sorted(merged.values(), key=lambda t: (-t.weight, t.name))


def apply(mod: IRModule, target: Target | str | dict[str, Any],
          database: ms.database.Database, *, fast_math: bool = False,
          dtype: str = "float32") -> tuple[IRModule, list[ModelTask], list[str]]:
    """(the partitioned model with `database`'s schedules applied and constant weights' packing
    folded, its tasks, the names of those without a record). `database`: any MetaSchedule
    database (`TunefarmDatabase` over SQL, `api.client.ms_database.RemoteDatabase`)."""
    target = _as_target(target)
    part = partition(mod, target, fast_math=fast_math, dtype=dtype)
    tasks = extract(part, target)
    untuned = [t.name for t in tasks
               if database.query_tuning_record(tvm.IRModule({"main": t.func}), target,
                                               t.name) is None]
    with target, database:
        applied = relax.transform.MetaScheduleApplyDatabase()(part)
    applied = mark_padded(applied)  # padded weights packed at compile time too
    applied = relax.transform.FoldConstant()(relax.transform.SplitLayoutRewritePreproc()(applied))
    return applied, tasks, untuned


def build(mod: IRModule, target: Target | str | dict[str, Any],
          database: ms.database.Database, *, fast_math: bool = False,
          dtype: str = "float32") -> Built:
    """Compile the model for `target` with `database`'s schedules."""
    target = _as_target(target)
    applied, tasks, untuned = apply(mod, target, database, fast_math=fast_math, dtype=dtype)
    return Built(tvm.compile(applied, target=target), tasks, untuned)
