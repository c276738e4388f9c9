"""The Redis cancel flag of a job (Keys.cancelled): set when a job is cancelled (by the API's
cancel route, or by the tuner that stops it), read by workers, which skip (acknowledge without
measuring) the queued measurements of a flagged job.

The flag is an optimisation, not the truth: SQL holds the job's state. Setting it never fails
the caller (a Redis outage is logged; the worker then measures a trial nobody will read), and it
expires after `CANCELLED_TTL_S`, long after every queued measurement of the job is gone.
"""

from __future__ import annotations

import logging

import redis

from .keys import Keys

log = logging.getLogger(__name__)

CANCELLED_TTL_S = 24 * 3600  # how long a cancelled job's flag outlives the cancel


def mark_cancelled(r: redis.Redis, keys: Keys, job_id: str) -> bool:
    """Flag the job cancelled; False (logged) when Redis could not be reached."""
    try:
        r.set(keys.cancelled(job_id), "1", ex=CANCELLED_TTL_S)
    except (redis.RedisError, OSError) as exc:
        log.warning("job %s is cancelled in SQL; its Redis cancel flag is not set: %s", job_id, exc)
        return False
    return True


def is_cancelled(r: redis.Redis, keys: Keys, job_id: str) -> bool:
    """Whether the job's cancel flag is set (Redis errors propagate to the caller)."""
    return bool(r.exists(keys.cancelled(job_id)))
