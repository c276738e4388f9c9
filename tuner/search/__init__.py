"""The search: model-guided evolutionary search over a design space, measured through a
`tuner.measure.Measurer`, committed to the tuning database (`loop`: `Tuner.run`; `request`: what
goes in and comes out), starting from the database's history (`history`), with tunefarm's XGBoost
cost model (`costmodel`)."""

from __future__ import annotations

from .costmodel import XGBCostModel
from .loop import Tuner
from .request import Progress, TuneRequest, TuneSummary

__all__ = ["Progress", "TuneRequest", "TuneSummary", "Tuner", "XGBCostModel"]
