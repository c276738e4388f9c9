"""Knob values of a measured candidate, named as `tunefarm spaces` names the knobs.

A trace stores its sampling decisions by instruction, not by knob: `[[index, decision], ...]`,
a categorical one as an index into the instruction's candidates. A template samples every knob
through `Template.sample` / `tile` / `split` (schedules/base.py), which note the knob's name while
a `recording()` is open; `design_space_names` generates the template's design spaces once under
one and pairs each design space's sampling instructions (their kinds and attributes: the
*signature*) with the names noted while it was scheduled. A candidate's trace is one of those
design spaces with other decisions (the search replays and mutates, it never adds a sampling
instruction), so its signature finds its names: `KnobNamer(trace_json)` gives
`{name: value}` with the value a knob took (a categorical's candidate, a perfect tile's factors).

A trace no design space explains (MetaSchedule's generated space, a record from elsewhere) gets
positional names by kind ("tile 0", "categorical 1", "compute-at 2"). Everything here reads the
trace's JSON only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_SHORT = {"SamplePerfectTile": "tile", "SampleCategorical": "categorical",
          "SampleComputeLocation": "compute-at", "SamplePartitionedTile": "tile"}
MAX_KNOBS = 64  # more sampling instructions than this: the first 64 are named

# the names noted per design space while a recording is open (one list per `schedule` call)
_NOTES: ContextVar[list[list[str]] | None] = ContextVar("tunefarm_knob_notes", default=None)


@contextmanager
def recording() -> Iterator[list[list[str]]]:
    """Collect the knob names sampled in this context: one list per design space begun."""
    notes: list[list[str]] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def begin_space() -> None:
    """A design space starts being scheduled (a no-op unless recording)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append([])


def note(name: str) -> None:
    """Knob `name` is sampled now, by one sampling instruction (a no-op unless recording)."""
    notes = _NOTES.get()
    if notes is not None:
        if not notes:
            notes.append([])
        notes[-1].append(name)


Sample = tuple[str, Any, Any]  # (kind, attrs, decision) of one sampling instruction


def samples(trace_json: str | Sequence[Any]) -> list[Sample]:
    """The sampling instructions of a trace (JSON text or `Trace.as_json()`), in order."""
    data: Any = json.loads(trace_json) if isinstance(trace_json, str) else trace_json
    insts, decisions = data[0], data[1]
    decided = {int(idx): dec for idx, dec in decisions}
    return [(str(insts[i][0]), insts[i][2], decided[i]) for i in sorted(decided)
            if 0 <= i < len(insts)]


def signature(trace_samples: Sequence[Sample]) -> str:
    """What identifies a design space's sampling instructions whatever their decisions."""
    return json.dumps([[kind, attrs] for kind, attrs, _ in trace_samples], sort_keys=True)


def value(kind: str, attrs: Any, decision: Any) -> Any:
    """The knob value a decision stands for: a categorical's candidate, else the decision."""
    if kind == "SampleCategorical" and isinstance(decision, int) and attrs \
            and isinstance(attrs[0], list) and 0 <= decision < len(attrs[0]):
        return attrs[0][decision]
    return decision


def _unique(names: Sequence[str]) -> list[str]:
    """Names made unique in order: a knob sampled twice is `name`, then `name #2`."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def positional(trace_samples: Sequence[Sample]) -> list[str]:
    return [f"{_SHORT.get(kind, kind)} {i}" for i, (kind, _, _) in enumerate(trace_samples)]


class KnobNamer:
    """Names the knob values of a candidate trace from its design spaces' names."""

    def __init__(self, spaces: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
        by_sig: dict[str, list[str] | None] = {}
        for sig, names in spaces:
            names = _unique(names)
            # two design spaces with one signature but other names cannot be told apart
            by_sig[sig] = names if by_sig.get(sig, names) == names else None
        self._by_sig = by_sig

    def names(self, trace_samples: Sequence[Sample]) -> list[str]:
        named = self._by_sig.get(signature(trace_samples))
        if named is None or len(named) != len(trace_samples):
            return positional(trace_samples)
        return named

    def __call__(self, trace_json: str | Sequence[Any]) -> dict[str, Any]:
        """`{knob name: value}` of a candidate, in sampling order (at most MAX_KNOBS)."""
        found = samples(trace_json)
        return {n: value(kind, attrs, dec) for n, (kind, attrs, dec)
                in list(zip(self.names(found), found, strict=True))[:MAX_KNOBS]}
