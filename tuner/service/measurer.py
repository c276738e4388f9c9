"""RemoteMeasurer: the search loop's measurer in service mode. Candidates go to the farm through
the Redis stream of their device key; the results come back through SQL (the API's results
endpoint commits every record a worker posts), so a tuner only ever waits on the database.

    prepare(batch)   XADD every input to Keys.measure(device_key)
    measure_one(inp) wait until SQL holds the trial's record (woken early by the job's "record"
                     events), or the farm gives up on it (Keys.lost: dead-lettered), or nobody
                     measured it within queue_wait_s -> a WORKER_LOST result (retried by the loop)

Redis may be wiped while we wait: an entry that vanished without a record is enqueued again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from tuner.db.rows import RecordRow
from tuner.db.store import Store
from tuner.measure import Invalidity, MeasureInput, MeasureResult
from tuner.queue import Keys, streams

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """The tuner process is stopping (or lost the job's lease, or the job was cancelled under
    it): the job's state is not this run's to decide; another tuner resumes it."""

    leave_job_state = True  # for the search loop: do not mark the job FAILED for this


@dataclass
class _Pending:
    inp: MeasureInput
    entry_id: str | None
    enqueued_at: float  # monotonic
    checked_at: float  # monotonic: last time the entry was seen in the stream


def result_of(row: RecordRow) -> MeasureResult:
    """The MeasureResult a committed record stands for."""
    return MeasureResult(trial_id=row.trial_id, invalidity=row.invalidity,
                         latencies_s=tuple(row.latencies), error_msg=row.error_msg,
                         build_s=row.build_s, worker=row.worker)


class RemoteMeasurer:
    """Measures through the farm; never raises for a lost measurement (WORKER_LOST instead).

    `redis_client` must decode responses (`tuner.queue.streams.connect`). `interrupt` (optional)
    is polled while waiting: a reason string abandons the wait with a WORKER_LOST result (job
    cancelled); `shutdown` set raises `Interrupted` (the tuner process is stopping)."""

    def __init__(self, redis_client: redis.Redis, keys: Keys, device_key: str, *, store: Store,
                 queue_wait_s: float, lease_s: float, poll_s: float = 0.2,
                 interrupt: Callable[[], str | None] | None = None,
                 shutdown: threading.Event | None = None) -> None:
        self.r = redis_client
        self.keys = keys
        self.device_key = device_key
        self.stream = keys.measure(device_key)
        self.store = store
        self.queue_wait_s = queue_wait_s
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.interrupt = interrupt or (lambda: None)
        self.shutdown = shutdown
        self._pending: dict[str, _Pending] = {}
        self._lost: dict[str, str] = {}  # trial_id -> reason, from Keys.lost
        self._lost_last: dict[str, str] = {}  # job_id -> last Keys.lost entry id read
        self._events_last: dict[str, str] = {}  # job_id -> last Keys.events entry id read
        self.requeued = 0  # entries enqueued again after they vanished (for tests and logs)

    # ------------------------------------------------------------------ queue
    def _enqueue(self, inp: MeasureInput) -> str | None:
        try:
            return streams.enqueue(self.r, self.stream, {"input": inp.to_json()})
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot enqueue trial %s on %s (will retry): %s", inp.trial_id,
                        self.stream, exc)
            return None

    def prepare(self, inputs: list[MeasureInput]) -> None:
        """Hand the whole batch to the farm now, so every worker of the device key can start."""
        now = time.monotonic()
        for inp in inputs:
            if inp.trial_id in self._pending:
                continue
            self._pending[inp.trial_id] = _Pending(inp, self._enqueue(inp), now, now)

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

    # ------------------------------------------------------------------ measure
    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        pend = self._pending.get(inp.trial_id)
        if pend is None:  # measured without prepare()
            now = time.monotonic()
            pend = self._pending[inp.trial_id] = _Pending(inp, self._enqueue(inp), now, now)
        job_id = (inp.context or {}).get("job_id")
        try:
            return self._wait(pend, job_id)
        finally:
            self._pending.pop(inp.trial_id, None)
            self._lost.pop(inp.trial_id, None)

    def _wait(self, pend: _Pending, job_id: str | None) -> MeasureResult:
        tid = pend.inp.trial_id
        while True:
            row = self.store.record(tid)
            if row is not None:
                return result_of(row)
            if job_id is not None:
                self._read_lost(job_id)
            if tid in self._lost:
                return self._lost_result(pend, f"the farm gave up on it: {self._lost[tid]}")
            if self.shutdown is not None and self.shutdown.is_set():
                raise Interrupted(f"the job was cancelled or the tuner is stopping while trial {tid} "
                                  "was measured")
            reason = self.interrupt()
            if reason:
                return self._lost_result(pend, f"measurement abandoned: {reason}")
            waited = time.monotonic() - pend.enqueued_at
            if waited > self.queue_wait_s:
                return self._lost_result(
                    pend, f"no worker for device key {self.device_key!r} finished it within "
                          f"{self.queue_wait_s:g} s")
            self._check_entry(pend, job_id)
            self._sleep(job_id)

    def _lost_result(self, pend: _Pending, msg: str) -> MeasureResult:
        """Give up on a trial: withdraw its entry (a retry enqueues a fresh one) and report it
        as an infrastructure failure."""
        tid = pend.inp.trial_id
        log.warning("trial %s: %s", tid, msg)
        if pend.entry_id is not None:
            try:
                self.r.xdel(self.stream, pend.entry_id)
            except (redis.RedisError, OSError):
                pass
        return MeasureResult.failure(tid, Invalidity.WORKER_LOST, msg)

    def _check_entry(self, pend: _Pending, job_id: str | None) -> None:
        """Every lease/3 s (at once if it was never enqueued): is the entry still queued or held
        by a worker? If Redis lost it and no record or lost mark exists, enqueue it again."""
        now = time.monotonic()
        if pend.entry_id is not None and now - pend.checked_at < self.lease_s / 3:
            return
        pend.checked_at = now
        try:
            if pend.entry_id is not None and streams.entry_exists(self.r, self.stream, pend.entry_id):
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
        pend.entry_id = self._enqueue(pend.inp)
        if pend.entry_id is not None:
            self.requeued += 1
            log.warning("trial %s vanished from %s (Redis flushed?): enqueued again as %s", tid,
                        self.stream, pend.entry_id)

    def _read_lost(self, job_id: str) -> None:
        last = self._lost_last.get(job_id, "0-0")
        try:
            rows = self.r.xrange(self.keys.lost(job_id), min=f"({last}", max="+", count=1000)
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
                newest = self.r.xrevrange(stream, count=1)
                last = self._events_last[job_id] = newest[0][0] if newest else "0-0"
            reply = self.r.xread({stream: last}, count=100, block=max(1, int(self.poll_s * 1000)))
            for _name, entries in reply or []:
                if entries:
                    self._events_last[job_id] = entries[-1][0]
        except (redis.RedisError, OSError):
            time.sleep(self.poll_s)
