"""Job events: a capped Redis stream per job (Keys.events(job_id)) that the API replays as
server-sent events. Types: "state" {"state", "error"?}, "progress" {"done", "total", "best_s",
"best_gflops", "last"}, "record" {"trial_id", "invalidity", "latency_s", "worker", "worker_name",
"build_s", "predicted_s", "knobs"}.

Events are a convenience: SQL holds the truth, so publishing never fails the caller (a Redis
outage is logged and the event dropped).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from .keys import Keys

log = logging.getLogger(__name__)

MAXLEN = 10_000  # events kept per job (approximate trim)
TTL_S = 3 * 24 * 3600  # a finished job's events expire after a few days


def publish(r: redis.Redis, keys: Keys, job_id: str, event_type: str,
            data: dict[str, Any] | None = None) -> str | None:
    """XADD {"event": type, "data": json} to Keys.events(job_id); returns the entry id, or None
    when Redis could not be reached."""
    stream = keys.events(job_id)
    try:
        pipe = r.pipeline(transaction=True)
        pipe.xadd(stream, {"event": event_type, "data": json.dumps(data or {}, default=str)},
                  maxlen=MAXLEN, approximate=True)
        pipe.expire(stream, TTL_S)
        entry_id, _ = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        log.warning("could not publish %s event of job %s: %s", event_type, job_id, exc)
        return None
    return str(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
