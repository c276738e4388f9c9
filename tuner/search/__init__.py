"""The search: model-guided evolutionary search over a design space, measured through a
`tuner.measure.Measurer`, committed to the tuning database (`loop`: `Tuner.run`; `request`: what
goes in and comes out), starting from the database's history (`history`), with tunefarm's XGBoost
cost model (`costmodel`); `task`: the setup before a job (`ResolvedTask`).

The names below load on first use: the API resolves tasks (`tuner.search.task`) without loading
the search loop and XGBoost.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .costmodel import XGBCostModel
    from .loop import Tuner
    from .request import Progress, TuneRequest, TuneSummary

__all__ = ["Progress", "TuneRequest", "TuneSummary", "Tuner", "XGBCostModel"]
_WHERE = {"XGBCostModel": ".costmodel", "Tuner": ".loop", "Progress": ".request",
          "TuneRequest": ".request", "TuneSummary": ".request"}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
