"""Schedules of related workloads, adapted to a new one: what a warm job measures first.

A template's schedule is the values its knobs took: the tiles (`SamplePerfectTile`) and the
choices (`SampleCategorical`) its trace sampled. The fastest records of the other workloads tuned
in the same space on the same target hold values that suit that family of kernels on that CPU,
and the same GEMM behind another epilogue, or the same convolution in another model, is best
with the same values. `candidates` replays each record's values on the new workload's design
space most like the one the record was sampled from, every tile adapted to this workload's loop
(the nearest factors that divide its extent), and keeps the programs that replay and pass the
space's postprocessors, fewest adaptations first. The search loop measures them at the head of
a job's first batch when the job has no measurements of its own (`TUNEFARM_COST_MODEL_TRANSFER`,
like the farm's model).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, cast

from schedules.knobs import divisors
from tuner.core import tvm_api as tv
from tuner.db import cost_models
from tuner.db.rows import TargetRef
from tuner.db.store import Store
from tuner.search.history import seed_records

log = logging.getLogger(__name__)

SOURCE_WORKLOADS = 24  # other workloads of the space looked at (the nearest in FLOPs)
PER_WORKLOAD = 3  # of each, its fastest records


def share(batch_size: int) -> int:
    """How many of a first batch's candidates may come from related workloads: half (the model's
    picks and random samples keep the other half, where no relative is a good guide)."""
    return batch_size // 2


class _Mismatch(Exception):
    """The design space samples other knobs than the record did."""


@dataclass(frozen=True)
class Transferred:
    cand: tv.ms.MeasureCandidate
    changes: int  # knob values adapted to this workload (0: replayed as recorded)


def knob_values(trace_json: str) -> list[tuple[str, Any]] | None:
    """A stored trace's knob values in trace order: a tile's factors, a categorical's chosen
    candidate (not its index: another workload's knob may offer other candidates). None when the
    trace samples anything else (a generated space's compute locations, ...)."""
    try:
        insts, decisions = json.loads(trace_json)
        out: list[tuple[str, Any]] = []
        for idx, dec in sorted(decisions, key=lambda d: int(d[0])):
            kind, _inputs, attrs, _outputs = insts[int(idx)]
            if kind == "SamplePerfectTile":
                out.append((kind, [int(f) for f in dec]))
            elif kind == "SampleCategorical":
                out.append((kind, int(attrs[0][int(dec)])))
            else:
                return None
        return out
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def adapt_tile(factors: list[int], extent: int, max_innermost: int) -> list[int]:
    """The perfect tile of `extent` nearest `factors` (a tile of another extent): from the
    innermost part out, each the largest divisor of what is left that is no larger than the
    wanted factor (the innermost also no larger than `max_innermost`, when positive); the
    outermost part takes the rest. The same extent gives `factors` back."""
    out, left = [1] * len(factors), extent
    for i in range(len(factors) - 1, 0, -1):
        cap = factors[i]
        if i == len(factors) - 1 and max_innermost > 0:
            cap = min(cap, max_innermost)
        out[i] = max(d for d in divisors(left) if d <= max(cap, 1))
        left //= out[i]
    out[0] = left
    return out


def nearest_choice(value: int, choices: list[int]) -> int:
    """The index of `value` among `choices`, else of the nearest (by ratio; 0 only matches 0)."""
    if value in choices:
        return choices.index(value)

    def distance(c: int) -> float:
        if c <= 0 or value <= 0:
            return math.inf if c != value else 0.0
        return abs(math.log(c / value))

    return min(range(len(choices)), key=lambda i: (distance(choices[i]), i))


_PLUMBING = {"GetSBlock", "GetChildBlocks", "GetLoops", "GetProducers", "GetConsumers",
             "ComputeInline", "ReverseComputeInline"}  # differ with the epilogue, not the design


def structure(trace_json: str) -> list[str]:
    """A trace's design, comparable across workloads: each instruction but the sampling ones and
    the block plumbing an epilogue adds (inlining, lookups), as its kind, its attributes and the
    order of its random-variable inputs by creation (which tells `reorder(i, j)` from
    `reorder(j, i)` whatever the numbering); up to the postprocessors."""
    insts, _ = json.loads(trace_json)
    born: dict[str, int] = {}
    out: list[str] = []
    for kind, inputs, attrs, outputs in insts:
        if kind == "EnterPostproc":
            break
        if not kind.startswith("Sample") and kind not in _PLUMBING:
            ids = [born[x] for x in inputs if isinstance(x, str) and x in born]
            order = sorted(range(len(ids)), key=ids.__getitem__)
            out.append(f"{kind}|{json.dumps(attrs)}|{order}")
        for rv in outputs:
            born.setdefault(rv, len(born))
    return out


def closest(source: list[str], designs: list[list[str]]) -> int:
    """The index of the design whose structure is most like `source`'s (the first of a tie)."""
    scores = [difflib.SequenceMatcher(None, source, d, autojunk=False).ratio() for d in designs]
    return max(range(len(designs)), key=lambda i: (scores[i], -i))


def replay_with(mod: tv.IRModule, design: tv.Trace, values: list[tuple[str, Any]],
                postprocs: list[tv.ms.postproc.Postproc]) -> tuple[tv.Schedule, int] | None:
    """`design` (a design space's trace) replayed on a fresh schedule of `mod` with `values`,
    then postprocessed: (schedule, values changed to fit), or None when the space samples other
    knobs, a value cannot be made to fit, or a postprocessor rejects the program."""
    sch = tv.Schedule(mod)
    queue = list(values)
    changes = 0

    def provide(inst: tv.tvm.s_tir.schedule.Instruction, inputs: list[Any], attrs: list[Any],
                decision: object) -> object:
        nonlocal changes
        kind = inst.kind.name
        if not kind.startswith("Sample"):
            return decision
        if not queue or queue[0][0] != kind:
            raise _Mismatch(kind)
        _, want = queue.pop(0)
        if kind == "SamplePerfectTile":
            # a SamplePerfectTile's input is a loop of a static extent
            extent = int(cast(tv.tvm.tirx.IntImm, cast(tv.tvm.tirx.For, sch.get(inputs[0])).extent))
            got = adapt_tile(want, extent, int(attrs[1]))
            changes += got != want
            return got
        choices = [int(c) for c in attrs[0]]
        idx = nearest_choice(want, choices)
        changes += choices[idx] != want
        return idx

    try:
        design.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
    except Exception:  # _Mismatch raised through TVM, or a tile TVM refuses
        return None
    if queue:
        return None
    try:
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:  # a postprocessor's own error: not a program
        return None
    return sch, changes


def candidates(store: Store, tref: TargetRef, wid: int, space: str, ctx: tv.ms.TuneContext,
               args_info: list[tv.ms.arg_info.ArgInfo], limit: int, *,
               flops: float) -> list[Transferred]:
    """Up to `limit` programs for workload `wid` from the fastest records of other workloads in
    `space` on the target, one per distinct program: those replayed as recorded first, then
    those adapted (fewest changes first, and only up to half of `limit` in all), each group in
    the records' order (the workloads nearest `flops` first, each fastest first). A record is
    replayed on the design space most like the one it was sampled from (`structure`)."""
    if limit <= 0:
        return []
    # the search's context: made with a module and a space, whose postprocessors it filled in;
    # its design spaces are traced
    mod = cast(tv.IRModule, ctx.mod)
    designs = [cast(tv.Trace, s.trace) for s in tv.design_spaces(ctx)]
    shapes = [structure(tv.trace_to_json(d)) for d in designs]
    space_gen = cast(tv.ms.space_generator.SpaceGenerator, ctx.space_generator)
    postprocs = list(cast("list[tv.ms.postproc.Postproc]", space_gen.postprocs))
    exact: list[Transferred] = []
    adapted: list[Transferred] = []
    seen: set[str] = set()
    for other in cost_models.space_relatives(store, tref.id, space, exclude=wid, flops=flops,
                                             limit=SOURCE_WORKLOADS):
        if len(exact) >= limit:
            break  # nothing adapted would be picked any more
        for row in seed_records(store, other, tref, space, PER_WORKLOAD):
            values = knob_values(row.trace_json)
            if values is None:
                continue
            # the design space the record was sampled from: the same values in another one
            # (the other loop order, ...) are another program, seldom as good
            try:
                design = designs[closest(structure(row.trace_json), shapes)]
            except (ValueError, TypeError, KeyError):
                continue
            if (got := replay_with(mod, design, values, postprocs)) is not None:
                sch, changes = got
                h = tv.shash_hex(sch.mod)
                if h not in seen:
                    seen.add(h)
                    (adapted if changes else exact).append(
                        Transferred(tv.ms.MeasureCandidate(sch, args_info), changes))
    adapted.sort(key=lambda t: t.changes)  # stable: the records' order within a count
    # an adapted schedule is a weaker guide than a relative's own: at most half of the share
    picked = (exact + adapted[: max(0, limit // 2 - len(exact))])[:limit]
    if picked:
        log.info("%d schedules of related workloads adapted to workload %d (%d as recorded)",
                 len(picked), wid, sum(t.changes == 0 for t in picked))
    return picked
