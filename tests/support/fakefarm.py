"""A fake farm worker thread for the service tests: it reads Keys.measure(device_key), writes each
input's record as the API's results endpoint does (`tuner.db.trials.commit_result`; an input
never issued through `Store.add_records`), publishes the "record" event and acknowledges the
entry. By default it measures nothing (`ok_result`); given a
`measurer` (e.g. a real LocalMeasurer) it measures each entry with it, as a worker would."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Self

import redis

from tests.support.fakes import ok_result
from tuner.db import Store, trials
from tuner.db.rows import NewRecord
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult
from tuner.queue import Keys, events, streams

__all__ = ["Behaviour", "FakeWorker", "make_inputs", "make_job", "ok_result"]

Behaviour = Callable[[MeasureInput], "MeasureResult | str | None"]


class FakeWorker:
    """A thread consuming the measure stream. `behaviour(inp)` returns a MeasureResult to
    commit, "dead" to dead-letter the entry, "drop" to read it and never ack (a crash), or
    None to commit what `measurer` measures (default: `ok_result`).

    With a `measurer`, each entry is prepared and measured like the worker agent does; a
    WORKER_LOST result is neither committed nor acknowledged (the agent leaves it to another
    worker)."""

    def __init__(self, redis_url: str, keys: Keys, store: Store, device_key: str = "dev", *,
                 behaviour: Behaviour | None = None, delay_s: float = 0.0,
                 measurer: Measurer | None = None) -> None:
        self.r = streams.connect(redis_url)
        self.keys, self.store, self.device_key = keys, store, device_key
        self.behaviour = behaviour or (lambda inp: None)
        self.delay_s = delay_s
        self.measurer = measurer
        self.stop = threading.Event()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def trials(self) -> list[str]:
        """The trials it measured, not counting confirmations (a new best measured again)."""
        return [t for t in self.seen if not t.endswith("-confirm")]

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.r.close()

    def _run(self) -> None:
        stream = self.keys.measure(self.device_key)
        group = Keys.WORKERS_GROUP
        while not self.stop.is_set():
            try:
                streams.ensure_group(self.r, stream, group)
                got = streams.read_new(self.r, stream, group, "fake", count=1, block_s=0.1)
            except redis.RedisError:
                time.sleep(0.05)
                continue
            for entry in got:
                self._handle(stream, group, entry)

    def _measure(self, inp: MeasureInput) -> MeasureResult:
        if self.measurer is None:
            return ok_result(inp)
        self.measurer.prepare([inp])
        return self.measurer.measure_one(inp)

    def _handle(self, stream: str, group: str, entry: streams.Entry) -> None:
        inp = MeasureInput.from_json(entry.fields["input"])
        self.seen.append(inp.trial_id)
        if self.delay_s:
            time.sleep(self.delay_s)
        out = self.behaviour(inp)
        if out == "drop":
            return
        if out == "dead":
            streams.dead_letter(self.r, self.keys, self.device_key, entry, reason="poison")
            return
        res = out if isinstance(out, MeasureResult) else self._measure(inp)
        if res.invalidity is Invalidity.WORKER_LOST:
            return
        rec = NewRecord.from_measurement(inp, res)
        if trials.issued(self.store, inp.trial_id) is not None:
            # as the API's results endpoint commits it: a farm record, served once confirmed; a
            # confirmation kept beside the job's trials
            trials.commit_result(self.store, rec, self.device_key, confirm=True)
        else:  # put on the stream by a test without issuing it
            self.store.add_records([rec])
        job_id = (inp.context or {}).get("job_id")
        if job_id and not (inp.context or {}).get("confirms"):
            events.publish(self.r, self.keys, job_id, "record",
                           {"trial_id": inp.trial_id, "invalidity": str(res.invalidity)})
        streams.ack(self.r, stream, group, entry.id)


def make_job(store: Store, *, trials: int = 8, state: str = "QUEUED") -> Any:
    """A job on a matmul-16 workload row and a {"kind": "llvm"} target row (device key "dev")."""
    from tuner.db.tables import JobState

    wid = store.ensure_workload(key="matmul-test", op="matmul",
                                spec_json=json.dumps({"op": "matmul", "shape": [16, 16, 16]}),
                                shash="0", mod_json="{}")
    tref = store.ensure_target('{"kind": "llvm", "num-cores": 1}', "dev")
    return store.create_job(job_key=uuid.uuid4().hex, workload_id=wid, target_id=tref.id,
                            space="default", trials=trials, state=JobState(state))


def make_inputs(job: Any, n: int, *, prefix: str = "t") -> list[MeasureInput]:
    """n inputs of `job` with a full record context."""
    out = []
    for i in range(n):
        tid = f"{prefix}{job.id[:8]}{i:04x}"
        ctx: dict[str, Any] = {"job_id": job.id, "workload_id": job.workload_id,
                               "target_id": job.target_id, "space": "default",
                               "cand_hash": f"{prefix}{i:015x}", "decisions": [],
                               "features_b64": None, "tvm_version": "test"}
        out.append(MeasureInput(trial_id=tid, workload_key="matmul-test",
                                workload_spec={"op": "matmul", "shape": [16, 16, 16]},
                                target={"kind": "llvm"}, trace_json="[]", context=ctx))
    return out
