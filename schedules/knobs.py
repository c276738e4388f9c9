"""A template's knobs, declared once: the table it samples from and the table it documents.

Each template (`schedules/base.py` `Template`) sets `KNOBS = knob_table(name=knob, ...)`, a
read-only name -> knob mapping of the frozen records below. The template samples a knob only
through `Template.sample` / `Template.split`, which read the record, and `Template.knobs()`
renders the same record as JSON: the values the search may pick and the values a user reads
come from one declaration.

Invariants:
- sampling a knob records exactly one sampling instruction (`SampleCategorical` or
  `SamplePerfectTile`) whose candidates and probabilities are computed here. A stored trace
  replays instruction by instruction, so how a knob samples is part of every record's format:
  change it and traces recorded before no longer describe the same space;
- `DesignSpace` and `Fixed` knobs are documentation only: a design space is a structural choice
  that replay cannot change (one design space per value, `Template.design_variants`), a fixed
  knob is a property every point of the space shares (e.g. a packed layout).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


def divides(value: int, extent: int) -> bool:
    """A `Categorical.fits` rule: the values that divide the loop's extent."""
    return extent % value == 0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def uniform(n: int) -> list[float]:
    return [1.0 / n] * n


@dataclass(frozen=True)
class Categorical:
    """One of `choices`, with `probs` (None: uniform). With `fits`, a sample for a given extent
    draws among the choices that fit it (`fits(value, extent)`), the probabilities renormalized,
    and `fallback` alone when none does."""

    choices: tuple[int, ...]
    doc: str
    probs: tuple[float, ...] | None = None
    fits: Callable[[int, int], bool] | None = None
    fallback: int | None = None

    def distribution(self, extent: int | None = None) -> tuple[list[int], list[float]]:
        """The candidates and probabilities of a sample (for `extent`, when `fits` is set)."""
        if self.fits is None or extent is None:
            probs = list(self.probs) if self.probs is not None else uniform(len(self.choices))
            return list(self.choices), probs
        if self.probs is None:
            kept = [v for v in self.choices if self.fits(v, extent)]
            if not kept and self.fallback is not None:
                kept = [self.fallback]
            return kept, uniform(len(kept))
        pairs = [(v, p) for v, p in zip(self.choices, self.probs, strict=True)
                 if self.fits(v, extent)]
        if not pairs and self.fallback is not None:
            pairs = [(self.fallback, 1.0)]
        total = sum(p for _, p in pairs)
        return [v for v, _ in pairs], [p / total for _, p in pairs]

    def render(self, extent: int | None) -> dict[str, Any]:
        choices, probs = self.distribution(extent)
        out: dict[str, Any] = {"kind": "categorical", "choices": choices}
        if self.probs is not None:
            out["probs"] = probs
        return {**out, "doc": self.doc}


@dataclass(frozen=True)
class PerfectTile:
    """A loop split into `parts` loops whose extents multiply to the loop's (a tile decision the
    search mutates); the innermost at most `max_innermost` (None: the loop's whole extent). `of`
    names the loop in the docs."""

    parts: int
    doc: str
    max_innermost: int | None = None
    of: str | None = None

    def render(self, extent: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "perfect_tile", "parts": self.parts}
        if self.max_innermost is not None:
            out["max_innermost"] = self.max_innermost
        if self.of is not None:
            out["of"] = self.of
        if extent is not None:
            out["extent"] = extent
        return {**out, "doc": self.doc}


@dataclass(frozen=True)
class RegisterTile:
    """A loop split into [outer, inner] with the inner extent drawn uniformly among the divisors
    of the loop's extent in [lo, hi], else the largest divisor <= hi: a register tile that fills
    the micro-kernel, never a degenerate narrow one (`lo` of 4: no 1- or 2-wide tile), and
    perfect unless `narrow_any`. `narrow`: the [lo, hi] on targets with 16 vector registers, not
    32 (AVX2: each wide accumulator there takes two registers), where the template asks for it
    (`Template.split(..., narrow=True)`). `narrow_any`: there, every extent in that range, not
    only the divisors (the split guards the last, partial tile with a predicate)."""

    lo: int
    hi: int
    of: str
    doc: str
    narrow: tuple[int, int] | None = None
    narrow_any: bool = False

    def choices(self, extent: int, *, narrow: bool = False, partial: bool = True) -> list[int]:
        """The inner extents to draw from; `partial=False`: divisors only, even with
        `narrow_any` (where the template cannot guard a partial tile)."""
        lo, hi = self.narrow if (narrow and self.narrow) else (self.lo, self.hi)
        if narrow and self.narrow and self.narrow_any and partial and lo < extent:
            return list(range(lo, min(hi, extent) + 1))
        divs = divisors(extent)
        fitting = [d for d in divs if lo <= d <= hi]
        return fitting or [max(d for d in divs if d <= hi)]

    def render(self, extent: int | None, *, partial: bool = True) -> dict[str, Any]:
        """The knob as JSON; with `extent`, its choices there (`partial`: False where the
        template cannot guard a partial tile, as in `choices`)."""
        out: dict[str, Any] = {"kind": "categorical"}
        if extent is not None:
            out["choices"] = self.choices(extent)
            if self.narrow:
                out["choices_narrow"] = self.choices(extent, narrow=True, partial=partial)
        doc = (f"{self.doc}: the divisors of {self.of} in [{self.lo}, {self.hi}] (else the "
               f"largest divisor <= {self.hi})")
        if self.narrow:
            which = ("any extent (divisors only where the template cannot guard a partial "
                     "tile)" if self.narrow_any else "the divisors")
            doc += (f"; {which} in [{self.narrow[0]}, {self.narrow[1]}] (choices_narrow) on "
                    f"targets with 16 vector registers (AVX2)")
        return {**out, "doc": doc}


@dataclass(frozen=True)
class DesignSpace:
    """A structural choice replay cannot change: one design space per value (the keyword
    argument of the same name of `Template.schedule`)."""

    choices: tuple[str, ...]
    doc: str

    def render(self, choices: list[str] | None) -> dict[str, Any]:
        values = list(self.choices if choices is None else choices)
        return {"kind": "design_space", "choices": values, "doc": self.doc}


@dataclass(frozen=True)
class Fixed:
    """A property every point of the space shares (documentation only)."""

    value: str
    doc: str

    def render(self) -> dict[str, Any]:
        return {"kind": "fixed", "value": self.value, "doc": self.doc}


Knob = Categorical | PerfectTile | RegisterTile | DesignSpace | Fixed


def knob_table(**knobs: Knob) -> Mapping[str, Knob]:
    """A template's `KNOBS`: read-only (one table shared by every instance), in the order given
    (the order `knobs()` lists them and `design_variants` nests the design spaces)."""
    return MappingProxyType(knobs)
