"""RemoteMeasurer: the search loop's measurer in service mode. Candidates go to the farm through
the Redis stream of their device key; the results come back through SQL (the API's results
endpoint commits every record a worker posts), so a tuner only ever waits on the database.

    prepare(batch)   issue every input (SQL `issued_trials`: the API accepts one result for
                     each, from a worker of this device key, within trial_ttl_s), then XADD
                     it to Keys.measure(device_key)
    measure_one(inp) wait until SQL holds the trial's record (woken early by the job's "record"
                     events), or the farm gives up on it (Keys.lost: dead-lettered), or nobody
                     measured it within queue_wait_s -> a WORKER_LOST result (retried by the loop)

Redis may be wiped while we wait: an entry that vanished without a record is issued and
enqueued again (issuing is idempotent: it only extends the trial's expiry).

No single worker sets a best (with `confirm`, the setting TUNEFARM_CONFIRM_BEST): the API
stores a worker's valid result as a farm record that GET /v1/best passes over until it is
confirmed (`tuner.db.trials`). A valid result that would become the workload's served best
is measured again before `measure_one` returns it: the same input as a confirmation trial
(`<trial id>-confirm`, context `confirms`), which the API hands to another live worker of the
key when there is one (`avoid`: the worker holding the first trial's lease), else to the same
worker's next fresh sandbox.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, cast

import redis

from tuner.core.errors import DatabaseError, JobHandedOff
from tuner.db import trials
from tuner.db.store import Store
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from tuner.measure.replay import result_of
from tuner.measure.watch import WorkerWatch
from tuner.queue import Keys, streams

log = logging.getLogger(__name__)

_Entries = list[tuple[str, dict[str, str]]]  # stream entries, as a decoding client returns them
CONFIRM_TRIES = 2  # a confirmation lost with its worker is enqueued once more


def confirmation_id(trial_id: str) -> str:
    """The trial id of the confirmation of `trial_id` (within the 64 characters of a trial)."""
    return f"{trial_id[:56]}-confirm"


def confirmation_of(inp: MeasureInput) -> MeasureInput:
    """The confirmation trial of `inp`: the same input, its own id, context `confirms`."""
    return replace(inp, trial_id=confirmation_id(inp.trial_id),
                   context={**(inp.context or {}), "confirms": inp.trial_id})


class FarmCounters(Protocol):
    """What a farm measurer counts (the tuner service's Prometheus metrics,
    `workers.service_metrics`, implement it)."""

    def device_key_seen(self, device_key: str) -> object: ...
    def trial_measured(self, device_key: str, invalidity: Invalidity) -> None: ...
    def trial_lost(self, device_key: str, reason: str) -> None: ...


class NoCounters:
    """Counts nothing (a measurer outside the tuner service)."""

    def device_key_seen(self, device_key: str) -> object:
        return None

    def trial_measured(self, device_key: str, invalidity: Invalidity) -> None:
        pass

    def trial_lost(self, device_key: str, reason: str) -> None:
        pass


class Interrupted(JobHandedOff):
    """The tuner process is stopping (or lost the job's lease, or the job was cancelled under
    it): the job's state is not this run's to decide; another tuner resumes it."""


@dataclass
class _Pending:
    inp: MeasureInput
    entry_id: str | None
    enqueued_at: float  # monotonic
    checked_at: float  # monotonic: last time the entry was seen in the stream


class RemoteMeasurer(Measurer):
    """Measures through the farm; never raises for a lost measurement (WORKER_LOST instead).
    The farm commits every record (the API's results endpoint): `commits_records`.

    Every input is issued in SQL (`tuner.db.trials.issue`) before it is enqueued, valid for
    `trial_ttl_s` (at least `queue_wait_s`): the API accepts a worker's result only for an
    issued trial. Inputs need a record context (job, workload, target, candidate hash).

    `redis_client` must decode responses (`tuner.queue.streams.connect`). `interrupt` (optional)
    is polled while waiting: a reason string abandons the wait with a WORKER_LOST result (job
    cancelled); `shutdown` set raises `Interrupted` (the tuner process is stopping); `watch`
    (optional) says why the job waits and ends it when no worker serves the key
    (`tuner.measure.watch`); `counters` counts trials, losses and device keys (the tuner service
    passes its metrics)."""

    commits_records = True  # the API's results endpoint writes each trial's record

    def __init__(self, redis_client: redis.Redis, keys: Keys, device_key: str, *, store: Store,
                 queue_wait_s: float, lease_s: float, poll_s: float = 0.2,
                 trial_ttl_s: float | None = None,
                 interrupt: Callable[[], str | None] | None = None,
                 shutdown: threading.Event | None = None,
                 watch: WorkerWatch | None = None, confirm: bool = False,
                 counters: FarmCounters | None = None) -> None:
        self.r = redis_client
        self.keys = keys
        self.device_key = device_key
        self.stream = keys.measure(device_key)
        self.store = store
        self.queue_wait_s = queue_wait_s
        self.lease_s = lease_s
        self.trial_ttl_s = max(trial_ttl_s or 0.0, queue_wait_s + lease_s)
        self.poll_s = poll_s
        self.interrupt = interrupt or (lambda: None)
        self.shutdown = shutdown
        self.watch = watch  # asked while a trial waits: does any worker serve the key?
        self._pending: dict[str, _Pending] = {}
        self._lost: dict[str, str] = {}  # trial_id -> reason, from Keys.lost
        self._lost_last: dict[str, str] = {}  # job_id -> last Keys.lost entry id read
        self._events_last: dict[str, str] = {}  # job_id -> last Keys.events entry id read
        self.requeued = 0  # entries enqueued again after they vanished (for tests and logs)
        self.confirm = confirm
        self._avoid: dict[str, str] = {}  # confirmation trial -> the worker to avoid
        self.counters: FarmCounters = counters or NoCounters()
        self.counters.device_key_seen(device_key)

    # ------------------------------------------------------------------ queue
    def _issue(self, inputs: list[MeasureInput]) -> bool:
        """Issue `inputs` in SQL (before they are enqueued); False when the database failed
        (they are not enqueued then: `_check_entry` tries again)."""
        try:
            for avoid in {self._avoid.get(i.trial_id) for i in inputs}:
                same = [i for i in inputs if self._avoid.get(i.trial_id) == avoid]
                trials.issue(self.store, same, self.device_key, self.trial_ttl_s, avoid=avoid)
            return True
        except DatabaseError as exc:
            log.warning("cannot issue %d trials (will retry): %s", len(inputs), exc)
            return False

    def _enqueue(self, inp: MeasureInput) -> str | None:
        fields = {"input": inp.to_json()}
        if (avoid := self._avoid.get(inp.trial_id)) is not None:
            fields["avoid"] = avoid
        try:
            return streams.enqueue(self.r, self.stream, fields)
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot enqueue trial %s on %s (will retry): %s", inp.trial_id,
                        self.stream, exc)
            return None

    def prepare(self, inputs: list[MeasureInput]) -> None:
        """Hand the whole batch to the farm now, so every worker of the device key can start."""
        now = time.monotonic()
        fresh = list({inp.trial_id: inp for inp in inputs
                      if inp.trial_id not in self._pending}.values())
        issued = self._issue(fresh) if fresh else True
        for inp in fresh:
            self._pending[inp.trial_id] = _Pending(
                inp, self._enqueue(inp) if issued else None, now, now)

    def discard(self) -> int:
        """Withdraw every entry still queued for this measurer (job stopped or finished):
        workers will not start them. Returns how many were withdrawn."""
        ids = [p.entry_id for p in self._pending.values() if p.entry_id]
        self._pending.clear()
        if not ids:
            return 0
        try:
            return int(self.r.xdel(self.stream, *ids))
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot withdraw %d entries from %s: %s", len(ids), self.stream, exc)
            return 0

    def close(self) -> None:
        """Withdraw what is still queued (`discard`)."""
        self.discard()

    # ------------------------------------------------------------------ measure
    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        pend = self._pending.get(inp.trial_id)
        if pend is None:  # measured without prepare()
            now = time.monotonic()
            entry = self._enqueue(inp) if self._issue([inp]) else None
            pend = self._pending[inp.trial_id] = _Pending(inp, entry, now, now)
        job_id = (inp.context or {}).get("job_id")
        try:
            res = self._wait(pend, job_id)
        finally:
            self._pending.pop(inp.trial_id, None)
            self._lost.pop(inp.trial_id, None)
        self.counters.trial_measured(self.device_key, res.invalidity)
        if self.confirm and res.invalidity is Invalidity.OK and self._leads(inp, res):
            self._confirm(inp, job_id)
        return res

    def _leads(self, inp: MeasureInput, res: MeasureResult) -> bool:
        """Would this valid farm result become its workload's served best? (Not a
        confirmation itself, and faster than the best served now, or none is served.)"""
        ctx = inp.context or {}
        if ctx.get("confirms") is not None or res.median_s is None:
            return False
        try:
            top = [r for r in self.store.best(int(ctx["workload_id"]), int(ctx["target_id"]),
                                              k=2, served=True) if r.trial_id != inp.trial_id]
        except (DatabaseError, KeyError, TypeError, ValueError) as exc:
            log.warning("trial %s: cannot read the served best (%s); not confirmed", inp.trial_id,
                        exc)
            return False
        # against the served record's own median, not the slower of its two: a candidate as
        # fast as the best within noise is not measured again
        return not top or top[0].median_s is None or res.median_s < top[0].median_s

    def _confirm(self, inp: MeasureInput, job_id: str | None) -> None:
        """Measure `inp` again as its confirmation trial, avoiding the worker that measured it
        when another is live; a lost confirmation is tried again once. The API records the
        verdict on the original record (confirmed at the slower median, or refuted)."""
        try:
            issued = trials.issued(self.store, inp.trial_id)
        except DatabaseError as exc:
            log.warning("trial %s: not confirmed, the database failed: %s", inp.trial_id, exc)
            return
        cinp = confirmation_of(inp)
        if issued is not None and issued.holder:
            self._avoid[cinp.trial_id] = issued.holder
        try:
            for _attempt in range(CONFIRM_TRIES):
                now = time.monotonic()
                entry = self._enqueue(cinp) if self._issue([cinp]) else None
                pend = self._pending[cinp.trial_id] = _Pending(cinp, entry, now, now)
                try:
                    res = self._wait(pend, job_id)
                except BaseException:  # the job stops: withdraw the confirmation too
                    self.discard()
                    raise
                finally:
                    self._pending.pop(cinp.trial_id, None)
                    self._lost.pop(cinp.trial_id, None)
                if res.invalidity is not Invalidity.WORKER_LOST:
                    log.info("trial %s confirmed by %s: %s", inp.trial_id, cinp.trial_id,
                             res.invalidity)
                    return
                if self.interrupt() or (self.shutdown is not None and self.shutdown.is_set()):
                    return  # abandoned with its job: not enqueued again
        finally:
            self._avoid.pop(cinp.trial_id, None)

    def _wait(self, pend: _Pending, job_id: str | None) -> MeasureResult:
        tid = pend.inp.trial_id
        while True:
            row = self.store.record(tid)
            if row is not None:
                return result_of(row)
            if job_id is not None:
                self._read_lost(job_id)
            if tid in self._lost:
                return self._lost_result(pend, "dead_letter",
                                         f"the farm gave up on it: {self._lost[tid]}")
            if self.shutdown is not None and self.shutdown.is_set():
                raise Interrupted(f"the job was cancelled or the tuner is stopping while trial "
                                  f"{tid} was measured")
            reason = self.interrupt()
            if reason:
                return self._lost_result(pend, "abandoned", f"measurement abandoned: {reason}")
            if self.watch is not None:
                self.watch.check()  # NoLiveWorker ends the job when no worker serves its key
            waited = time.monotonic() - pend.enqueued_at
            if waited > self.queue_wait_s:
                return self._lost_result(
                    pend, "timeout", f"no worker for device key {self.device_key!r} finished it "
                                     f"within {self.queue_wait_s:g} s")
            self._check_entry(pend, job_id)
            self._sleep(job_id)

    def _lost_result(self, pend: _Pending, reason: str, msg: str) -> MeasureResult:
        """Give up on a trial: withdraw its entry (a retry enqueues a fresh one) and report it
        as an infrastructure failure (`reason`: its metrics label)."""
        tid = pend.inp.trial_id
        self.counters.trial_lost(self.device_key, reason)
        log.warning("trial %s: %s", tid, msg)
        if pend.entry_id is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self.r.xdel(self.stream, pend.entry_id)
        return MeasureResult.failure(tid, Invalidity.WORKER_LOST, msg)

    def _check_entry(self, pend: _Pending, job_id: str | None) -> None:
        """Every lease/3 s (at once if it was never enqueued): is the entry still queued or held
        by a worker? If Redis lost it and no record or lost mark exists, enqueue it again."""
        now = time.monotonic()
        if pend.entry_id is not None and now - pend.checked_at < self.lease_s / 3:
            return
        pend.checked_at = now
        try:
            if (pend.entry_id is not None
                    and streams.entry_exists(self.r, self.stream, pend.entry_id)):
                return
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot check trial %s on %s: %s", pend.inp.trial_id, self.stream, exc)
            return
        # gone: acknowledged (a record must exist now), dead-lettered, or flushed
        tid = pend.inp.trial_id
        if self.store.record(tid) is not None:
            return
        if job_id is not None:
            self._read_lost(job_id)
        if tid in self._lost:
            return
        pend.entry_id = self._enqueue(pend.inp) if self._issue([pend.inp]) else None
        if pend.entry_id is not None:
            self.requeued += 1
            log.warning("trial %s vanished from %s (Redis flushed?): enqueued again as %s", tid,
                        self.stream, pend.entry_id)

    def _read_lost(self, job_id: str) -> None:
        last = self._lost_last.get(job_id, "0-0")
        try:
            rows = cast(_Entries, self.r.xrange(self.keys.lost(job_id), min=f"({last}", max="+",
                                                count=1000))
        except (redis.RedisError, OSError):
            return
        for entry_id, fields in rows:
            self._lost_last[job_id] = entry_id
            tid = fields.get("trial_id")
            if tid in self._pending:
                self._lost[tid] = fields.get("reason") or "dead-lettered"

    def _sleep(self, job_id: str | None) -> None:
        """Wait up to poll_s, returning early when the job's stream gets a new event (a record
        landed). Falls back to a plain sleep without Redis."""
        if job_id is None:
            time.sleep(self.poll_s)
            return
        stream = self.keys.events(job_id)
        try:
            last = self._events_last.get(job_id)
            if last is None:
                newest = cast(_Entries, self.r.xrevrange(stream, count=1))
                last = self._events_last[job_id] = newest[0][0] if newest else "0-0"
            reply = cast(list[tuple[str, _Entries]] | None, self.r.xread(
                {stream: last}, count=100, block=max(1, int(self.poll_s * 1000))))
            for _name, entries in reply or []:
                if entries:
                    self._events_last[job_id] = entries[-1][0]
        except (redis.RedisError, OSError):
            time.sleep(self.poll_s)
