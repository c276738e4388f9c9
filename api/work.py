"""Measurement work for farm workers, handed out by the API: a worker holds only the API URL and
its token (no Redis, no SQL credentials), and the API runs the queue protocol on its behalf on
the stream of the worker's registered device key (`Keys.measure(device_key)`, consumer = the
worker id, group `Keys.WORKERS_GROUP`):

    lease(ctx, worker, n, wait_s)   XAUTOCLAIM entries idle past the lease (dead-lettering poison
                                    ones, delivered more than max_deliveries times), else
                                    XREADGROUP new ones (waiting up to wait_s); every entry read
                                    back is parsed and checked as a MeasureInput (a bad one is
                                    dead-lettered) and entries of cancelled jobs are acknowledged
                                    unmeasured; -> [{entry_id, deliveries, input}]
    renew(ctx, worker, ids)         XCLAIM JUSTID (idle time reset) of the ids this worker holds
    ack(ctx, worker, ids)           XACK + XDEL of the ids this worker holds
    dead_letter(ctx, worker, ids, reason)   the ids this worker holds -> Keys.dead / Keys.lost

A confirmation entry (field `avoid`: the worker that measured the trial it confirms) read by
that worker while another worker of the key is live is parked (`Keys.parked`), not handed out:
the next lease of another worker takes it first. It comes back to the avoided worker when the
lease runs out unclaimed after AVOID_DELIVERIES deliveries (a fresh sandbox, then).

Renew, ack and dead-letter act only on entries pending for this worker (XPENDING with the
consumer), checked and applied atomically in Redis (a Lua script), so a worker can neither keep,
acknowledge nor drop an entry another worker holds. Entry ids are Redis stream ids
`<ms>-<seq>`, both parts below 2**64; lists are bounded by `MAX_ENTRIES`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Annotated, Any, cast

import redis
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from redis.asyncio import Redis as AsyncRedis
from starlette.concurrency import run_in_threadpool

from tuner.db import trials
from tuner.db import workers as workers_db
from tuner.db.workers import WorkerRow
from tuner.measure import MeasureInput, MeasureOptions
from tuner.queue import Keys, is_cancelled, streams
from tuner.queue.streams import STREAM_ID_PATTERN

from .context import ApiContext
from .metrics import Metrics
from .schemas import JsonInt

log = logging.getLogger(__name__)

MAX_ENTRIES = 64  # entries per lease, ids per renew/ack/dead-letter request
MAX_WAIT_S = 10.0  # longest a lease request waits for new entries
BLOCK_SLICE_S = 5.0  # one XREADGROUP BLOCK at most (below the Redis client's socket timeout)
MAX_INPUT_CHARS = 8 << 20  # a queued MeasureInput larger than this is not handed out
MAX_TRIAL_ID = 128
AVOID_DELIVERIES = 2  # deliveries a confirmation is held back from the avoided worker
_ENTRY_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")


def check_entry_id(value: str) -> str:
    """A Redis stream id `<ms>-<seq>` with both parts below 2**64 (else ValueError)."""
    m = _ENTRY_ID.fullmatch(value)
    if m is None or int(m[1]) >= 2**64 or int(m[2]) >= 2**64:
        raise ValueError("an entry id is a stream id <ms>-<seq> (both integers below 2**64)")
    return value


EntryId = Annotated[str, Field(max_length=41, json_schema_extra={"pattern": STREAM_ID_PATTERN}),
                    AfterValidator(check_entry_id)]
EntryIdList = Annotated[list[EntryId], Field(min_length=1, max_length=MAX_ENTRIES)]


# --------------------------------------------------------------------------- bodies
class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max: JsonInt = Field(default=1, ge=1, le=MAX_ENTRIES, strict=True,
                     description="Entries wanted at most.")
    wait_s: float = Field(default=1.0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False, strict=True,
                          description="How long to wait for new entries when none is ready.")


class LeasedEntry(BaseModel):
    entry_id: str = Field(description="The queue entry: renew it while measuring, ack it after "
                                      "the result was posted.")
    deliveries: int = Field(description="How many times the entry was handed out (this time "
                                        "included); above 1 it was reclaimed from a dead worker.")
    input: dict[str, Any] = Field(description="tuner.measure.MeasureInput as a dict.")


class Lease(BaseModel):
    entries: list[LeasedEntry]


class EntryIds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entry_ids: EntryIdList


class DeadLetterRequest(EntryIds):
    reason: str = Field(min_length=1, max_length=2000, description="Why the entry is dropped.")


class EntryIdsPublic(BaseModel):
    entry_ids: list[str] = Field(description="The ids the request applied to (ids this worker "
                                             "does not hold are left out).")


# --------------------------------------------------------------------------- redis scripts
# KEYS[1]: the stream; ARGV: group, consumer, mode ("renew" | "ack" | "held"), ids...
# Returns the ids pending for the consumer, after renewing (XCLAIM JUSTID) or acknowledging
# (XACK + XDEL) them; a missing group (Redis flushed) holds nothing.
_HELD_LUA = """
local stream, group, consumer, mode = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local held = {}
for i = 4, #ARGV do
  local p = redis.pcall('XPENDING', stream, group, ARGV[i], ARGV[i], 1, consumer)
  if type(p) == 'table' and p.err then return {} end
  if #p > 0 then
    table.insert(held, ARGV[i])
  end
end
if #held > 0 then
  if mode == 'renew' then
    local args = {stream, group, consumer, 0}
    for _, id in ipairs(held) do table.insert(args, id) end
    table.insert(args, 'JUSTID')
    redis.call('XCLAIM', unpack(args))
  elseif mode == 'ack' then
    redis.call('XACK', stream, group, unpack(held))
    redis.call('XDEL', stream, unpack(held))
  end
end
return held
"""


def _held(ctx: ApiContext, worker: WorkerRow, entry_ids: list[str], mode: str) -> list[str]:
    script = ctx.extra.get("work_held_script")
    if script is None:
        script = ctx.extra["work_held_script"] = ctx.sync_redis.register_script(_HELD_LUA)
    stream = ctx.keys.measure(worker.device_key)
    ids = list(dict.fromkeys(entry_ids))  # once each, in order
    out = script(keys=[stream], args=[Keys.WORKERS_GROUP, worker.id, mode, *ids])
    return [x.decode() if isinstance(x, bytes) else str(x) for x in out or []]


def renew(ctx: ApiContext, worker: WorkerRow, entry_ids: list[str]) -> list[str]:
    """Reset the idle time of the entries this worker holds (so no other worker reclaims them
    while it measures); returns those ids. An id left out was acknowledged, dead-lettered,
    reclaimed by another worker after the lease ran out, or lost to a Redis flush."""
    return _held(ctx, worker, entry_ids, "renew")


def ack(ctx: ApiContext, worker: WorkerRow, entry_ids: list[str]) -> list[str]:
    """Acknowledge (and delete) the entries this worker holds; returns those ids."""
    acked = _held(ctx, worker, entry_ids, "ack")
    if acked:
        log.debug("worker %s acknowledged %s", worker.id, acked)
    return acked


def dead_letter(ctx: ApiContext, worker: WorkerRow, entry_ids: list[str],
                reason: str) -> list[str]:
    """Move the entries this worker holds to the dead letters (and the trial to its job's lost
    stream, so the tuner gives up on it at once); returns those ids."""
    r, stream = ctx.sync_redis, ctx.keys.measure(worker.device_key)
    out = []
    for entry_id in _held(ctx, worker, entry_ids, "held"):
        raw = r.xrange(stream, min=entry_id, max=entry_id, count=1)
        if not raw:
            continue
        counts = streams.deliveries(r, stream, Keys.WORKERS_GROUP, [entry_id])
        entry_fields = {str(k): str(v) for k, v in (raw[0][1] or {}).items()}
        entry = streams.Entry(entry_id, entry_fields, counts.get(entry_id, 1))
        streams.dead_letter(r, ctx.keys, worker.device_key, entry,
                            reason=f"worker {worker.id}: {reason}")
        out.append(entry_id)
    if out and (m := _metrics(ctx)) is not None:
        m.dead_lettered(worker.device_key, "worker", len(out))
    return out


def _metrics(ctx: ApiContext) -> Metrics | None:
    """The app's metrics (absent from a context built outside the app, in tests)."""
    return ctx.extra.get("metrics")


# --------------------------------------------------------------------------- lease
async def lease(ctx: ApiContext, worker: WorkerRow, n: int, wait_s: float) -> list[LeasedEntry]:
    """Up to `n` entries for `worker`: reclaimed ones first, else new ones, waiting up to
    `wait_s` for one to arrive (in slices of BLOCK_SLICE_S)."""
    out = await run_in_threadpool(_take_parked, ctx, worker, n)
    if out:
        return out
    out = await run_in_threadpool(_reclaim, ctx, worker, n)
    if out:
        return out
    stream = ctx.keys.measure(worker.device_key)
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        block_s = min(left, BLOCK_SLICE_S) if left >= 0.001 else None
        entries = await _read_new(ctx.redis, stream, worker.id, n, block_s)
        if entries:
            out = await run_in_threadpool(_vet, ctx, worker, entries)
            if out:
                return out
        elif block_s is None or deadline - time.monotonic() < 0.001:
            return []


async def _read_new(r: AsyncRedis, stream: str, consumer: str, n: int,
                    block_s: float | None) -> list[streams.Entry]:
    """XREADGROUP `>` on the async client (a waiting lease holds no thread); a missing group
    (Redis flushed) is created and the read retried once."""
    block = None if block_s is None else max(1, int(block_s * 1000))
    for attempt in range(2):
        try:
            reply = cast("list[Sequence[Any]] | None", await r.xreadgroup(  # [[stream, entries]]
                Keys.WORKERS_GROUP, consumer, {stream: ">"}, count=n, block=block))
        except redis.ResponseError as exc:
            if attempt == 0 and str(exc).startswith("NOGROUP"):
                try:
                    await r.xgroup_create(stream, Keys.WORKERS_GROUP, id="0", mkstream=True)
                except redis.ResponseError as busy:
                    if "BUSYGROUP" not in str(busy):
                        raise
                continue
            raise
        out: list[streams.Entry] = []
        for _name, raw in reply or []:
            for entry_id, entry_fields in raw or []:
                if entry_fields is not None:
                    out.append(streams.Entry(str(entry_id), {
                        str(k): str(v) for k, v in entry_fields.items()}))
        return out
    return []


def _reclaim(ctx: ApiContext, worker: WorkerRow, n: int) -> list[LeasedEntry]:
    """Entries other (dead) workers held idle past the lease; poison ones are dead-lettered."""
    r, s = ctx.sync_redis, ctx.settings
    stream = ctx.keys.measure(worker.device_key)
    keep = []
    m = _metrics(ctx)
    for e in streams.reclaim(r, stream, Keys.WORKERS_GROUP, worker.id, min_idle_s=s.lease_s,
                             count=n):
        if e.deliveries > s.max_deliveries:
            streams.dead_letter(r, ctx.keys, worker.device_key, e, reason=(
                f"delivered {e.deliveries} times (max {s.max_deliveries}): the workers "
                "measuring it died or lost it"))
            if m is not None:
                m.dead_lettered(worker.device_key, "max_deliveries")
        else:
            log.info("worker %s reclaimed entry %s (delivery %d)", worker.id, e.id, e.deliveries)
            keep.append(e)
    if keep and m is not None:
        m.reclaimed(worker.device_key, len(keep))
    return _vet(ctx, worker, keep)


def _take_parked(ctx: ApiContext, worker: WorkerRow, n: int) -> list[LeasedEntry]:
    """Confirmation entries parked away from another worker, claimed for this one."""
    r, key = ctx.sync_redis, ctx.keys.parked(worker.device_key)
    parked: dict[str, str] = r.hgetall(key) or {}  # type: ignore[assignment]
    mine: list[Any] = [eid for eid, avoid in parked.items() if avoid != worker.id][:n]
    if not mine:
        return []
    r.hdel(key, *mine)
    stream = ctx.keys.measure(worker.device_key)
    try:
        claimed = streams.entries_of(r.xclaim(stream, Keys.WORKERS_GROUP, worker.id,
                                            min_idle_time=0, message_ids=mine))
    except redis.ResponseError:  # the group vanished with a flush: nothing is parked
        return []
    counts = streams.deliveries(r, stream, Keys.WORKERS_GROUP, [e.id for e in claimed])
    log.info("worker %s takes parked confirmations %s", worker.id, [e.id for e in claimed])
    return _vet(ctx, worker, [streams.Entry(e.id, e.fields, counts.get(e.id, 1))
                              for e in claimed])


def _park(ctx: ApiContext, worker: WorkerRow, e: streams.Entry) -> bool:
    """Hold back a confirmation entry from the worker it must avoid while another worker of
    the key is live (it stays pending for this worker until another takes it)."""
    if e.fields.get("avoid") != worker.id or e.deliveries > AVOID_DELIVERIES:
        return False
    others = [w for w in workers_db.live_ids(ctx.store, worker.device_key,
                                             stale_after_s=3 * ctx.settings.heartbeat_s)
              if w != worker.id]
    if not others:
        return False
    ctx.sync_redis.hset(ctx.keys.parked(worker.device_key), e.id, worker.id)
    log.info("confirmation entry %s held back from worker %s for %s", e.id, worker.id, others)
    return True


def _vet(ctx: ApiContext, worker: WorkerRow, entries: list[streams.Entry]) -> list[LeasedEntry]:
    """The entries to hand out: each parsed and checked (else dead-lettered); those of cancelled
    jobs are acknowledged unmeasured; a confirmation that must avoid this worker is parked."""
    r = ctx.sync_redis
    out = []
    for e in entries:
        if _park(ctx, worker, e):
            continue
        try:
            inp = parse_input(e.fields.get("input"))
        except ValueError as exc:
            streams.dead_letter(r, ctx.keys, worker.device_key, e,
                                reason=f"not a valid MeasureInput: {exc}")
            if (m := _metrics(ctx)) is not None:
                m.dead_lettered(worker.device_key, "invalid_input")
            continue
        job_id = (inp.context or {}).get("job_id")
        if job_id and is_cancelled(r, ctx.keys, job_id):
            log.info("trial %s: job %s is cancelled; acknowledged unmeasured", inp.trial_id,
                     job_id)
            streams.ack(r, ctx.keys.measure(worker.device_key), Keys.WORKERS_GROUP, e.id)
            continue
        out.append(LeasedEntry(entry_id=e.id, deliveries=e.deliveries,
                               input=json.loads(inp.to_json())))
    if out:  # only the worker holding a trial's lease may answer it
        trials.hold(ctx.store, (str(e.input["trial_id"]) for e in out), worker.id)
    return out


# --------------------------------------------------------------------------- input checks
def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_options(o: MeasureOptions) -> None:
    """Each option has the type of its default (bool, int, finite float; None: optional
    number) and numbers are not negative."""
    for f in fields(MeasureOptions):
        v, default = getattr(o, f.name), f.default
        if isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, int):
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        elif isinstance(default, float):
            ok = _number(v) and v >= 0
        elif default is None:
            ok = v is None or (_number(v) and v >= 0)
        else:
            ok = True
        if not ok:
            raise ValueError(f"options.{f.name} is {v!r}")


def parse_input(raw: str | None) -> MeasureInput:
    """A queued MeasureInput, checked before a worker gets it (ValueError says what is wrong):
    JSON of the right shape and types, no host-local artifact (a farm input never has one:
    a worker must not load a library from a path named in the queue)."""
    if not isinstance(raw, str) or not raw:
        raise ValueError("the entry has no input")
    if len(raw) > MAX_INPUT_CHARS:
        raise ValueError(f"the input is larger than {MAX_INPUT_CHARS} characters")
    try:
        inp = MeasureInput.from_json(raw)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise ValueError(f"not a MeasureInput: {exc}") from exc
    checks = (
        (isinstance(inp.trial_id, str) and 0 < len(inp.trial_id) <= MAX_TRIAL_ID, "trial_id"),
        (isinstance(inp.workload_key, str) and bool(inp.workload_key), "workload_key"),
        (isinstance(inp.workload_spec, dict), "workload_spec"),
        (isinstance(inp.target, dict), "target"),
        (isinstance(inp.trace_json, str), "trace_json"),
        (inp.context is None or isinstance(inp.context, dict), "context"),
        (inp.artifact is None and inp.artifact_params is None and inp.artifact_sha256 is None,
         "artifact"),
    )
    bad = [name for ok, name in checks if not ok]
    if bad:
        raise ValueError(f"bad {', '.join(bad)}")
    job_id = (inp.context or {}).get("job_id")
    if job_id is not None and not isinstance(job_id, str):
        raise ValueError("bad context.job_id")
    _check_options(inp.options)
    return inp
