"""Observers of the search's timed work, for a service's metrics: the search measures how long a
cost-model fit takes and tells whoever registered (`on_fit`); it imports no metrics library.

    remove = observe.on_fit(lambda model, seconds: ...)   # model: "job" or "farm"

"job" is the refit of a job's own booster (`XGBCostModel.fit`, after every batch and at the
job's start), "farm" a training of the target's farm model (`farm_model.train`: after a job, or
`tunefarm model train`). An observer that raises is logged and never fails the fit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

FitObserver = Callable[[str, float], None]

_observers: list[FitObserver] = []
_lock = threading.Lock()


def on_fit(fn: FitObserver) -> Callable[[], None]:
    """Call `fn(model, seconds)` after every cost-model fit in this process; returns a function
    that removes it again."""
    with _lock:
        _observers.append(fn)

    def remove() -> None:
        with _lock:
            if fn in _observers:
                _observers.remove(fn)

    return remove


def fitted(model: str, seconds: float) -> None:
    """A fit of `model` ("job" or "farm") took `seconds`: tell every observer."""
    with _lock:
        observers = list(_observers)
    for fn in observers:
        try:
            fn(model, seconds)
        except Exception:
            log.exception("a cost-model fit observer failed")
