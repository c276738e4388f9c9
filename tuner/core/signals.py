"""SIGTERM/SIGINT as a stop request, for the long-running processes (the tuner service, workers)."""

from __future__ import annotations

import signal
import threading
from typing import Any


def stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM/SIGINT set `stop` (main thread only); returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        old[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    return old


def restore(handlers: dict[int, Any]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
