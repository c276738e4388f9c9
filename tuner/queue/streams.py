"""Thin helpers over Redis Streams consumer groups: the farm's work queues.

Delivery is **at least once**: an entry is acknowledged (XACK) only after its effect is durable
(a result committed to SQL), so a crash between the two delivers it again and every handler must
be idempotent (records are keyed by trial id). A consumer that dies holding entries loses them to
`reclaim` (XAUTOCLAIM) once they sat idle longer than the lease; a consumer still working on an
entry renews its lease with `keep_lease`. An entry delivered more than `max_deliveries` times is
poison: `dead_letter` moves it aside.

Redis may be wiped (FLUSHALL) at any time: SQL is the source of truth. The helpers re-create a
missing consumer group on the next read instead of failing (`NOGROUP`).

Every helper takes a `redis.Redis` created with `decode_responses=True` (see `connect`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from .keys import Keys


def _below(bound: int) -> str:
    """A regex of the strings of ASCII digits (leading zeros allowed) no longer than `bound - 1`
    written out whose value is below `bound`."""
    top = str(bound - 1)
    n = len(top)
    alts = [f"[0-9]{{1,{n - 1}}}"] if n > 1 else []
    for i, ch in enumerate(top):
        if ch != "0":
            rest = f"[0-9]{{{n - i - 1}}}" if i < n - 1 else ""
            alts.append(f"{top[:i]}[0-{int(ch) - 1}]{rest}")
    alts.append(top)
    return "(?:" + "|".join(alts) + ")"


# a Redis stream id `<ms>-<seq>`, each part an unsigned 64-bit integer: the pattern the API
# checks and documents (entry ids, Last-Event-ID)
STREAM_ID = f"{_below(1 << 64)}-{_below(1 << 64)}"
STREAM_ID_PATTERN = f"^{STREAM_ID}$"

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Entry:
    """One stream entry as a consumer sees it; `deliveries` counts this delivery too."""

    id: str
    fields: dict[str, str] = field(default_factory=dict)
    deliveries: int = 1


def connect(url: str, **kw: Any) -> redis.Redis:
    """A client for these helpers (string replies, bounded connect time)."""
    kw.setdefault("socket_connect_timeout", 5)
    kw.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(url, decode_responses=True, **kw)


def _is_nogroup(exc: BaseException) -> bool:
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("NOGROUP")


def ensure_group(r: redis.Redis, stream: str, group: str) -> bool:
    """Create `group` on `stream` (and the stream) if missing; True when it was created. The group
    starts at the beginning of the stream, so entries added before it existed (e.g. re-enqueued
    after a flush, before any consumer came back) are delivered."""
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return False
        raise
    log.info("created consumer group %s on %s", group, stream)
    return True


def enqueue(r: redis.Redis, stream: str, fields: Mapping[str, str], *,
            maxlen: int | None = None) -> str:
    """XADD; returns the entry id. `maxlen` trims approximately (never for work queues: a trimmed
    pending entry is a lost one)."""
    values: dict[Any, Any] = dict(fields)
    return str(r.xadd(stream, values, maxlen=maxlen, approximate=True))


def entries_of(raw: Sequence[Any] | None) -> list[Entry]:
    """The entries of an XREAD/XCLAIM/XAUTOCLAIM reply (those deleted while pending left out)."""
    out = []
    for entry_id, fields in raw or []:
        if fields is None:  # deleted while pending (Redis < 7 reports it this way)
            continue
        out.append(Entry(str(entry_id), dict(fields)))
    return out


def read_new(r: redis.Redis, stream: str, group: str, consumer: str, *, count: int = 1,
             block_s: float | None = None) -> list[Entry]:
    """XREADGROUP `>`: up to `count` never-delivered entries, waiting up to `block_s` (None: do
    not wait). A missing group (Redis flushed) is re-created and the read retried once."""
    block = None if block_s is None else max(1, int(block_s * 1000))
    for attempt in range(2):
        try:
            reply = cast("list[Sequence[Any]] | None",  # [[stream, entries]] (RESP2)
                         r.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block))
        except redis.ResponseError as exc:
            if attempt == 0 and _is_nogroup(exc):
                ensure_group(r, stream, group)
                continue
            raise
        out: list[Entry] = []
        for _name, raw in reply or []:
            out.extend(entries_of(raw))
        return out
    return []  # pragma: no cover - the loop returns or raises


def deliveries(r: redis.Redis, stream: str, group: str, entry_ids: Sequence[str]) -> dict[str, int]:
    """Delivery counts of pending entries (XPENDING); ids not pending are left out."""
    out: dict[str, int] = {}
    for entry_id in entry_ids:
        try:
            rows = r.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
        except redis.ResponseError as exc:
            if _is_nogroup(exc):
                return out
            raise
        for row in rows:
            out[str(row["message_id"])] = int(row["times_delivered"])
    return out


def reclaim(r: redis.Redis, stream: str, group: str, consumer: str, *, min_idle_s: float,
            count: int = 10, max_scans: int = 10) -> list[Entry]:
    """XAUTOCLAIM: take over up to `count` entries that another (dead) consumer has held idle for
    longer than `min_idle_s`, with their delivery counts (this delivery included). Entries that
    were deleted from the stream while pending are dropped from the group by Redis itself."""
    claimed: list[Entry] = []
    cursor = "0-0"
    for _ in range(max_scans):  # XAUTOCLAIM looks at ~10*count pending entries per call
        try:
            reply = r.xautoclaim(stream, group, consumer, min_idle_time=int(min_idle_s * 1000),
                                 start_id=cursor, count=count - len(claimed))
        except redis.ResponseError as exc:
            if _is_nogroup(exc):
                ensure_group(r, stream, group)
                return []
            raise
        claimed += entries_of(reply[1] if len(reply) > 1 else [])
        cursor = str(reply[0])
        if cursor == "0-0" or len(claimed) >= count:
            break
    if not claimed:
        return []
    counts = deliveries(r, stream, group, [e.id for e in claimed])
    return [Entry(e.id, e.fields, counts.get(e.id, 1)) for e in claimed if e.id in counts]


def keep_lease(r: redis.Redis, stream: str, group: str, consumer: str,
               entry_ids: Sequence[str]) -> list[str]:
    """Reset the idle time of entries this consumer is still working on (XCLAIM JUSTID, min-idle
    0: does not count as a delivery). Returns the ids still held; an id missing from the answer
    was acknowledged, deleted, or lost to a flush."""
    if not entry_ids:
        return []
    try:
        held = r.xclaim(stream, group, consumer, min_idle_time=0, message_ids=list(entry_ids),
                        justid=True)
    except redis.ResponseError as exc:
        if _is_nogroup(exc):
            return []
        raise
    return [str(x) for x in held]


def ack(r: redis.Redis, stream: str, group: str, *entry_ids: str, delete: bool = True) -> int:
    """XACK (and XDEL, so a work stream does not grow without bound: with one group per stream
    an acknowledged entry is done). Returns how many were pending."""
    if not entry_ids:
        return 0
    pipe = r.pipeline(transaction=True)
    pipe.xack(stream, group, *entry_ids)
    if delete:
        pipe.xdel(stream, *entry_ids)
    try:
        res = pipe.execute()
    except redis.ResponseError as exc:
        if _is_nogroup(exc):
            return 0
        raise
    return int(res[0])


def dead_letter(r: redis.Redis, keys: Keys, device_key: str, entry: Entry, *, reason: str,
                group: str | None = None) -> None:
    """Move a poison entry of Keys.measure(device_key) aside: XADD to Keys.dead(device_key) and,
    when the input names its job, to Keys.lost(job_id) (the tuner waiting on it then gives up on
    the trial at once), then acknowledge it."""
    raw = entry.fields.get("input", "")
    trial_id, job_id = None, None
    try:
        d = json.loads(raw)
        trial_id = d.get("trial_id")
        job_id = (d.get("context") or {}).get("job_id")
    except (ValueError, AttributeError):
        pass
    pipe = r.pipeline(transaction=True)
    pipe.xadd(keys.dead(device_key), {"input": raw, "reason": reason,
                                      "deliveries": str(entry.deliveries)},
              maxlen=10_000, approximate=True)
    if job_id and trial_id:
        lost = keys.lost(job_id)
        pipe.xadd(lost, {"trial_id": trial_id, "reason": reason}, maxlen=10_000, approximate=True)
        pipe.expire(lost, 7 * 24 * 3600)
    pipe.execute()
    ack(r, keys.measure(device_key), group or keys.WORKERS_GROUP, entry.id)
    log.warning("dead-lettered trial %s of job %s after %d deliveries: %s", trial_id, job_id,
                entry.deliveries, reason)


def entry_exists(r: redis.Redis, stream: str, entry_id: str) -> bool:
    """Whether the entry is still in the stream (not yet acknowledged-and-deleted, not flushed)."""
    return bool(r.xrange(stream, min=entry_id, max=entry_id, count=1))
