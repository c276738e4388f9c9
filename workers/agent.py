"""`tunefarm worker`: the measurement agent of one board class (device key). It holds only the
API URL and a worker token: no Redis and no SQL credentials; the API runs the queue for it.

    register over the API -> heartbeat thread
    loop: POST .../lease (the API reclaims entries a dead worker held past the lease, dead-
          lettering poison ones, else reads new ones; it skips trials of cancelled jobs and
          checks every input it hands out) -> build the batch (LocalMeasurer.prepare) ->
          measure each candidate -> POST the result -> POST .../ack only after the result was
          answered 200

Delivery is at least once: a crash anywhere before the ack hands the entry to another worker
after the lease, and the API commits a trial id once. While a candidate is built or timed, a
lease thread renews the entries held (POST .../renew), so a long measurement is never stolen.
An infrastructure failure (WORKER_LOST: the sandbox could not start, the board's RPC server died)
is recorded under an attempt id of its own (it never trains the cost model) and the candidate is
measured again at once (over RPC: on another board); if it keeps failing, the entry is left to
another worker. After `quarantine_after` infrastructure failures in a row the worker quarantines
itself: it takes no work until a health probe of its board passes. SIGTERM drains: the current
candidate is finished, posted and acked.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Self

from api.client import ApiError, Client
from tuner.core import logs, signals
from tuner.core.errors import TunefarmError
from tuner.core.isolation import undumpable
from tuner.core.liveness import Renewer
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from workers.agent_metrics import Metered, MeteredClient

log = logging.getLogger(__name__)

POST_GIVE_UP_DRAINING_S = 60.0  # while draining, stop retrying a post after this (stays pending)
LOST_RETRIES = 1  # measure again at once after an infrastructure failure (another board over RPC)
LEASE_WAIT_S = 2.0  # a lease request waits this long for new work (bounds the drain delay too)
MAX_ENTRIES = 64  # entries per lease/renew request (the API's bound)


@dataclass
class WorkerConfig:
    """What the API told us at registration."""

    worker_id: str
    lease_s: float
    heartbeat_s: float
    max_deliveries: int


@dataclass
class Stats:
    measured: int = 0
    failures: int = 0
    infra_failures: int = 0
    infra_in_a_row: int = 0
    state: str = "idle"


@dataclass(frozen=True)
class Entry:
    """A leased queue entry: its id (to renew and ack), the input, its delivery count."""

    id: str
    inp: MeasureInput
    deliveries: int = 1


class _Leases:
    """Keeps the entries this worker holds from being reclaimed (POST .../renew every lease/3,
    on a client of its own, from a `Renewer`)."""

    def __init__(self, client: Client, worker_id: str, lease_s: float) -> None:
        self.client, self.worker_id = client, worker_id
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._renewer = Renewer("leases", max(0.05, lease_s / 3), self._renew,
                                what="the leases of held entries", retry_on=(ApiError,))

    def __enter__(self) -> Self:
        self._renewer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._renewer.stop()

    def hold(self, *entry_ids: str) -> None:
        with self._lock:
            self._held.update(entry_ids)

    def drop(self, *entry_ids: str) -> None:
        with self._lock:
            self._held.difference_update(entry_ids)

    def _renew(self) -> None:
        with self._lock:
            ids = sorted(self._held)
        kept: set[str] = set()
        for i in range(0, len(ids), MAX_ENTRIES):
            kept.update(self.client.renew(self.worker_id, ids[i:i + MAX_ENTRIES]))
        gone = set(ids) - kept
        if gone:  # withdrawn by the tuner, reclaimed after a lapse, or Redis lost them
            log.info("entries %s are no longer held (withdrawn or flushed)", sorted(gone))
            self.drop(*gone)


@dataclass
class Agent:
    """One worker process's loop over the entries of its device key."""

    client: Client
    lease_client: Client  # renews leases from the lease thread
    cfg: WorkerConfig
    device_key: str
    measurer: Measurer
    stop_event: threading.Event
    concurrency: int = 1
    quarantine_after: int = 3  # infrastructure failures in a row
    probe_s: float = 10.0  # between health probes while quarantined
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self.consumer = self.cfg.worker_id

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        with _Leases(self.lease_client, self.consumer, self.cfg.lease_s) as leases:
            while not self.stop_event.is_set():
                if self.stats.state == "quarantined":
                    self._probe()
                    continue
                try:
                    entries = self._next_entries()
                except ApiError as err:
                    if not err.transient:
                        raise TunefarmError(f"the API refused to lease work: {err}") from err
                    log.warning("cannot lease work from the API (%s); retrying", err)
                    self.stop_event.wait(1.0)
                    continue
                if not entries:
                    continue
                try:
                    self.process(entries, leases)
                except Exception:
                    log.exception("worker %s: a batch failed; its entries go to other workers",
                                  self.consumer)
                    self.stop_event.wait(1.0)

    def _next_entries(self) -> list[Entry]:
        """A lease from the API: entries a dead worker held past the lease first (the API
        dead-letters poison ones and skips cancelled jobs), else new ones (waiting up to
        LEASE_WAIT_S)."""
        out = []
        for raw in self.client.lease(self.consumer, max_entries=self.concurrency,
                                     wait_s=LEASE_WAIT_S):
            e = self._parse(raw)
            if e is None:
                continue
            if e.deliveries > 1:
                log.info("reclaimed entry %s (delivery %d)", e.id, e.deliveries)
            out.append(e)
        return out

    def process(self, entries: list[Entry], leases: _Leases) -> None:
        """Measure, post and acknowledge a batch of entries (one candidate at a time)."""
        leases.hold(*(e.id for e in entries))
        todo = [(e, e.inp) for e in entries]
        try:
            if todo:
                self.stats.state = "busy"
                self.measurer.prepare([inp for _, inp in todo])
            for i, (e, inp) in enumerate(todo):
                if i and (self.stop_event.is_set() or self.stats.state == "quarantined"):
                    log.info("%s: %d held entries are left to other workers",
                             self.stats.state, len(todo) - i)
                    break
                with logs.bound(job_id=(inp.context or {}).get("job_id"), trial_id=inp.trial_id):
                    self._measure_post_ack(e, inp)
        finally:
            leases.drop(*(e.id for e in entries))
            if self.stats.state != "quarantined":
                self.stats.state = "draining" if self.stop_event.is_set() else "idle"

    def _parse(self, raw: Any) -> Entry | None:
        """A leased entry as the API answered it; one this worker cannot read is dead-lettered
        (the API checked it, so this means the two disagree on the protocol)."""
        entry_id = raw.get("entry_id") if isinstance(raw, dict) else None
        if not isinstance(entry_id, str):
            log.error("the API leased an entry without an id: %.200r", raw)
            return None
        try:
            inp = MeasureInput.from_json(json.dumps(raw["input"]))
            return Entry(entry_id, inp, int(raw.get("deliveries") or 1))
        except (KeyError, TypeError, ValueError) as exc:
            self._give_up(entry_id, f"not a MeasureInput this worker can read: {exc}")
            return None

    def _give_up(self, entry_id: str, reason: str) -> None:
        try:
            self.client.dead_letter(self.consumer, [entry_id], reason)
        except ApiError as err:
            log.warning("cannot dead-letter entry %s (%s): it returns after the lease",
                        entry_id, err)

    def _ack(self, entry_id: str) -> None:
        try:
            self.client.ack(self.consumer, [entry_id])
        except ApiError as err:  # the result is committed; the entry returns after the lease
            log.warning("cannot acknowledge entry %s: %s", entry_id, err)

    def _measure_post_ack(self, e: Entry, inp: MeasureInput) -> None:
        t0 = time.monotonic()
        for _attempt in range(1 + LOST_RETRIES):
            res = self.measurer.measure_one(inp)
            if res.invalidity is not Invalidity.WORKER_LOST:
                self.stats.infra_in_a_row = 0
                break
            self._lost(inp, res)
            if self.stats.state == "quarantined":
                break
        else:
            # still not the kernel's fault: another worker gets it after the lease (or it is
            # dead-lettered after max_deliveries); posting it as the trial would burn its id
            log.warning("trial %s: infrastructure failures, left to another worker: %s",
                        inp.trial_id, res.error_msg)
            return
        if res.invalidity is Invalidity.WORKER_LOST:
            return
        if self._post(e, inp, res):
            self._ack(e.id)
            self.stats.measured += 1
            self.stats.failures += 0 if res.ok else 1
            log.info("trial %s: %s %s in %.1f s", inp.trial_id, res.invalidity,
                     f"{res.median_s * 1e6:.1f} us" if res.median_s else "", time.monotonic() - t0)

    def _lost(self, inp: MeasureInput, res: MeasureResult) -> None:
        """Record an infrastructure failure as its own attempt (worker_lost: never trains the
        model, never takes the trial id); quarantine after too many in a row."""
        self.stats.infra_failures += 1
        self.stats.infra_in_a_row += 1
        log.warning("trial %s: infrastructure failure (%d in a row): %s", inp.trial_id,
                    self.stats.infra_in_a_row, res.error_msg)
        attempt = f"{inp.trial_id[:20]}-lost-{uuid.uuid4().hex[:8]}"
        try:
            self.client.post_result(self.cfg.worker_id, replace(inp, trial_id=attempt),
                                    replace(res, trial_id=attempt))
        except ApiError as err:
            log.warning("cannot record the failed attempt of %s: %s", inp.trial_id, err)
        if self.stats.infra_in_a_row >= self.quarantine_after:
            log.error("worker %s quarantined after %d infrastructure failures in a row; probing "
                      "its board every %.0f s", self.consumer, self.stats.infra_in_a_row,
                      self.probe_s)
            self.stats.state = "quarantined"

    def _probe(self) -> None:
        """While quarantined: wait, then ask the measurer whether its board works again."""
        if self.stop_event.wait(self.probe_s):
            return
        try:
            healthy = bool(self.measurer.probe())
        except Exception as exc:  # a failing probe is an answer, not a crash
            log.warning("health probe failed: %s", exc)
            healthy = False
        if healthy:
            log.info("worker %s re-admitted: the health probe passed", self.consumer)
            self.stats.infra_in_a_row = 0
            self.stats.state = "idle"

    def _post(self, e: Entry, inp: MeasureInput, res: MeasureResult) -> bool:
        """POST the result until the API takes it; True once it answered 200. A result the API
        rejects for good (4xx) is dead-lettered; while draining, give up after a minute."""
        delay, started = 0.5, time.monotonic()
        while True:
            try:
                self.client.post_result(self.cfg.worker_id, inp, res)
                return True
            except ApiError as err:
                if not err.transient:
                    self._reject(e, inp, err)
                    return False
                log.warning("cannot post trial %s (%s); retrying in %.1f s", inp.trial_id, err,
                            delay)
            if self.stop_event.is_set() and time.monotonic() - started > POST_GIVE_UP_DRAINING_S:
                log.error("draining: trial %s not posted; its entry stays pending", inp.trial_id)
                return False
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _reject(self, e: Entry, inp: MeasureInput, err: ApiError) -> None:
        log.error("the API rejected the result of trial %s: %s", inp.trial_id, err)
        self._give_up(e.id, f"the API rejected the result: {err}")


# ---------------------------------------------------------------------- registration, heartbeat
def register(client: Client, *, name: str, device_key: str, target: dict[str, Any],
             stop_event: threading.Event, mode: str = "local") -> WorkerConfig | None:
    """Register over the API, retrying while it is unreachable; None if stopped first."""
    from tuner.core import tvm_api as tv
    from tuner.core.config import get_settings

    caps: dict[str, Any] = {"mode": mode, "cpus": os.cpu_count() or 1}
    if get_settings().emulated(device_key):  # its timings are emulation's (an emulated board)
        caps["emulated"] = True
    delay = 0.5
    while not stop_event.is_set():
        try:
            reg = client.register_worker(
                name=name, device_key=device_key, target=target, tvm_version=tv.tvm_version(),
                hostname=socket.gethostname(), capabilities=caps)
        except ApiError as err:
            if not err.transient:
                raise TunefarmError(f"the API refused to register this worker: {err}") from err
            log.warning("cannot register with the API (%s); retrying in %.1f s", err, delay)
            stop_event.wait(delay)
            delay = min(delay * 2, 10.0)
            continue
        return WorkerConfig(worker_id=str(reg["id"]), lease_s=float(reg["lease_s"]),
                            heartbeat_s=float(reg["heartbeat_s"]),
                            max_deliveries=int(reg["max_deliveries"]))
    return None


def _heartbeats(client: Client, cfg: WorkerConfig, stats: Stats) -> Renewer:
    """The worker's heartbeat every `heartbeat_s` (its state and counts), not yet started."""
    def beat() -> None:
        client.heartbeat(cfg.worker_id, state=stats.state, measured=stats.measured,
                         failures=stats.failures, infra_failures=stats.infra_failures)

    return Renewer("heartbeat", cfg.heartbeat_s, beat, what="the heartbeat", retry_on=(ApiError,))


def run_worker(*, api_url: str, token: str | None, device_key: str,
               target: dict[str, Any], name: str | None = None,
               stop_event: threading.Event | None = None, concurrency: int = 1,
               measurer_factory: Callable[[str], Measurer] | None = None,
               quarantine_after: int | None = None, probe_s: float | None = None,
               rpc_tracker: tuple[str, int] | None = None, rpc_key: str | None = None) -> int:
    """The `tunefarm worker` loop until SIGTERM/SIGINT or `stop_event` (drains, returns 0).
    `concurrency`: entries taken at once (built in parallel, timed one by one).
    `rpc_tracker` (host, port): build here, run on the boards registered with that TVM RPC
    tracker under `rpc_key` (default: the device key); else this machine is the board.
    `measurer_factory(worker_id)` (tests) replaces the measurer. Everything goes through the
    API at `api_url` with `token` (a worker token)."""
    stop = stop_event or threading.Event()
    restore = signals.stop_on_signals(stop)
    undumpable()  # the token: not readable by a sandbox child of the same user
    client = MeteredClient(api_url, token, device_key=device_key)  # counts reclaims, dead letters
    beat_client = Client(api_url, token, retries=0)
    lease_client = Client(api_url, token, retries=0)
    measurer: Measurer | None = None
    beat: Renewer | None = None
    try:
        name = name or f"{socket.gethostname()}:{os.getpid()}"
        cfg = register(client, name=name,
                       device_key=device_key, target=target, stop_event=stop,
                       mode="rpc" if rpc_tracker else "local")
        if cfg is None:
            return 0
        log.info("worker %s (%s) measures device key %r", cfg.worker_id, name, device_key)
        if measurer_factory is not None:
            measurer = measurer_factory(cfg.worker_id)
        elif rpc_tracker is not None:
            from tuner.core.config import get_settings
            from tuner.measure.rpc import RpcMeasurer

            measurer = RpcMeasurer(*rpc_tracker, rpc_key or device_key, worker_id=cfg.worker_id,
                                   build_workers=max(1, concurrency),
                                   deadline_factor=get_settings().deadline_factor(device_key))
        else:
            from tuner.measure.local import LocalMeasurer

            measurer = LocalMeasurer(worker_id=cfg.worker_id)
        measurer = Metered(measurer, device_key)  # counts and times every measurement
        from tuner.core.config import get_settings

        s = get_settings()
        agent = Agent(client, lease_client, cfg, device_key, measurer, stop,
                      min(max(1, concurrency), MAX_ENTRIES),
                      quarantine_after=quarantine_after or s.quarantine_after,
                      probe_s=probe_s if probe_s is not None else s.probe_s)
        beat = _heartbeats(beat_client, cfg, agent.stats).start()
        agent.run()
        beat.stop(timeout=15)
        _final_heartbeat(beat_client, cfg, agent.stats)
        log.info("worker %s stopped: %d measured", cfg.worker_id, agent.stats.measured)
        return 0
    finally:
        if beat is not None:
            beat.stop()
        signals.restore(restore)
        if measurer is not None:
            measurer.close()
        client.close()
        beat_client.close()
        lease_client.close()


def _final_heartbeat(client: Client, cfg: WorkerConfig, stats: Stats) -> None:
    try:
        client.heartbeat(cfg.worker_id, state="offline", measured=stats.measured,
                         failures=stats.failures, infra_failures=stats.infra_failures)
    except ApiError as err:
        log.warning("final heartbeat failed: %s", err)
