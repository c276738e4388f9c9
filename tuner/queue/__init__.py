"""Work in flight on Redis Streams: job ids for tuners, measurements for workers, job events.

SQL stays the source of truth: everything here may vanish (a Redis restart or FLUSHALL) and the
tuners and workers recover from the database. Every key name lives in `keys.py`.
"""

from .cancel import CANCELLED_TTL_S, is_cancelled, mark_cancelled
from .keys import Keys

__all__ = ["CANCELLED_TTL_S", "Keys", "is_cancelled", "mark_cancelled"]
