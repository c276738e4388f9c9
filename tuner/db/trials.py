"""Issued trials: what the tuner handed to the farm, and the one result the API accepts for each.

    issue(store, inputs, device_key, ttl_s)   one `issued_trials` row per MeasureInput (its
                                               job, workload, target and candidate hash from the
                                               input's context), valid for ttl_s; issuing a trial
                                               again only extends its expiry
    hold(store, trial_ids, worker_id)         the API handed these trials' queue entries to
                                               `worker_id` (a new lease or a reclaimed one)
    commit_result(store, record, device_key)  the record of a worker's result, inserted only if
                                               it matches its issued, unexpired trial (the input
                                               as issued: `NewRecord.input_digest`), the
                                               worker's device key and the lease's holder, and
                                               only once: checked, used (`used_at`) and
                                               inserted in one transaction

No single worker sets a best (`confirm`, the setting TUNEFARM_CONFIRM_BEST): a valid result
is stored as a FARM record (`models.Trust`), which
`Store.best(served=True)` passes over until a second measurement of the same input (a trial
issued with `confirms`, by the tuner's `RemoteMeasurer`) confirms it, at the slower of the two
medians, or refutes it; both records are kept (the confirmation's outside its job's trials,
linked by `confirms`).

A worker that could not measure a trial (worker_lost: its board or sandbox failed) records the
failed attempt under its own id, `<trial_id[:20]>-lost-<hex>`: accepted for an issued, unexpired
trial of the worker's device key (same job, workload, target, candidate), at most
MAX_LOST_ATTEMPTS per trial, without using the trial (its real result still comes).

A rejected result raises `TrialRejected` (its `code` is an API problem code, `field` names what
differs) and writes nothing. Posting the same result again for a used trial is an idempotent
retry: `commit_result` answers False (nothing new written); a different result is `trial_used`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..core.errors import Conflict
from ..core.measurements import Invalidity, MeasureInput, MeasureResult
from . import tables as m
from .rows import NewRecord
from .store import Store
from .tables import utcnow

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PgInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

# (issued column, the record's attribute, the posted field it comes from)
_BOUND = (("job_id", "job_id", "input.context.job_id"),
          ("workload_id", "workload_id", "input.context.workload_id"),
          ("target_id", "target_id", "input.context.target_id"),
          ("cand_hash", "cand_hash", "input.context.cand_hash"))


MAX_LOST_ATTEMPTS = 16  # worker_lost attempts recorded per issued trial
_LOST_ID = re.compile(r"(?P<base>.{1,20})-lost-[0-9a-f]{1,32}", re.DOTALL)


class TrialRejected(Conflict):
    """A result the issued trial does not allow: `code` is `unknown_trial` (never issued, or
    expired), `trial_mismatch` (job, workload, target, candidate or device key differ: `field`
    names it), `not_lease_holder` (another worker holds the trial's lease) or `trial_used` (the
    trial already has a different result)."""

    def __init__(self, code: str, message: str, *, field: str) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.detail = message


def _binding(inp: MeasureInput) -> dict[str, Any]:
    """The bound columns of an input (ValueError when its context cannot bind it)."""
    ctx = inp.context or {}
    try:
        out = {"trial_id": str(inp.trial_id), "job_id": str(ctx["job_id"]),
               "workload_id": int(ctx["workload_id"]), "target_id": int(ctx["target_id"]),
               "cand_hash": str(ctx["cand_hash"])}
        # what the record will take from the input, as the tuner issued it
        unmeasured = MeasureResult(inp.trial_id, Invalidity.WORKER_LOST)
        out["input_sha256"] = NewRecord.from_measurement(inp, unmeasured).input_digest()
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"trial {inp.trial_id} cannot be issued: its context lacks job_id, "
                         f"workload_id, target_id or cand_hash ({exc})") from exc
    if ctx["job_id"] is None:
        raise ValueError(f"trial {inp.trial_id} cannot be issued: it belongs to no job")
    confirms = ctx.get("confirms")
    if confirms is not None and not (isinstance(confirms, str) and 0 < len(confirms) <= 64):
        raise ValueError(f"trial {inp.trial_id} cannot be issued: context.confirms must be "
                         "a trial id")
    out["confirms"] = confirms
    return out


def _insert(store: Store) -> PgInsert | SqliteInsert:
    if store.dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(m.IssuedTrial)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(m.IssuedTrial)


def issue(store: Store, inputs: Iterable[MeasureInput], device_key: str, ttl_s: float, *,
          avoid: str | None = None) -> int:
    """Record that `inputs` were handed to the workers of `device_key`: each accepts one result
    until `ttl_s` from now. Idempotent: a trial issued before keeps its binding and gets the new
    expiry (a re-enqueued or retried trial). An input whose context `confirms` a trial is that
    trial's confirmation (its result confirms or refutes the record: `commit_result`); `avoid`
    names the worker that measured the original (the API prefers another). Returns how many
    inputs were issued."""
    now = utcnow()
    expires = now + timedelta(seconds=float(ttl_s))
    rows: dict[str, dict[str, Any]] = {}
    for inp in inputs:
        row = _binding(inp)
        rows.setdefault(row["trial_id"], {**row, "device_key": device_key, "issued_at": now,
                                          "expires_at": expires, "avoid": avoid})
    if not rows:
        return 0
    values = list(rows.values())
    with store.session() as s:
        for i in range(0, len(values), 500):
            stmt = _insert(store).values(values[i:i + 500])
            s.execute(stmt.on_conflict_do_update(
                index_elements=["trial_id"], set_={"expires_at": stmt.excluded.expires_at}))
    return len(values)


def hold(store: Store, trial_ids: Iterable[str], worker_id: str) -> None:
    """The queue entries of `trial_ids` were handed to `worker_id`: from now on only it may
    answer them (a lease that expired and went to another worker moves with it)."""
    ids = sorted(set(trial_ids))
    with store.session() as s:
        for i in range(0, len(ids), 500):
            s.execute(update(m.IssuedTrial).where(m.IssuedTrial.trial_id.in_(ids[i:i + 500]))
                      .values(holder=worker_id))


def known(store: Store, trial_id: str) -> bool:
    """Whether `trial_id` was issued, or is a worker's failed attempt at an issued trial (a
    cheap first check: `commit_result` checks everything again)."""
    lost = _LOST_ID.fullmatch(trial_id)
    base = lost["base"] if lost else trial_id
    same = (m.IssuedTrial.trial_id.startswith(base, autoescape=True) if lost and len(base) == 20
            else m.IssuedTrial.trial_id == base)
    with store.session() as s:
        return s.scalar(select(m.IssuedTrial.trial_id).where(same).limit(1)) is not None


def issued(store: Store, trial_id: str) -> m.IssuedTrial | None:
    """The issued row of a trial (detached), or None."""
    with store.session() as s:
        return s.get(m.IssuedTrial, trial_id)


def _same(row: m.Record, rec: NewRecord) -> bool:
    """Is `rec` the result already stored (a retry of the same post)?"""
    return (row.invalidity == Invalidity(rec.invalidity).value
            and json.loads(row.latencies_json) == [float(x) for x in rec.latencies or []]
            and row.error_msg == rec.error_msg and row.trace_json == rec.trace_json
            and row.cand_hash == rec.cand_hash and row.job_id == rec.job_id)


def _check(trial: m.IssuedTrial, rec: NewRecord, device_key: str) -> None:
    for column, attr, field in _BOUND:
        want, got = getattr(trial, column), getattr(rec, attr)
        if want != got:
            raise TrialRejected("trial_mismatch", f"trial {rec.trial_id} was issued with "
                                f"{column} {want!r}, the result names {got!r}", field=field)
    if trial.device_key != device_key:
        raise TrialRejected("trial_mismatch", f"trial {rec.trial_id} was issued to device key "
                            f"{trial.device_key!r}, not to this worker's {device_key!r}",
                            field="device_key")
    if trial.input_sha256 != rec.input_digest():
        raise TrialRejected("trial_mismatch", f"the input posted for trial {rec.trial_id} is not "
                            "the one issued (its trace, decisions, features, space or TVM "
                            "version differ)", field="input")


def commit_result(store: Store, rec: NewRecord, device_key: str, *,
                  now: datetime | None = None,
                  plausible: Callable[[NewRecord], None] | None = None,
                  worker_id: str | None = None, confirm: bool = False) -> bool:
    """Insert the record of a worker's result if its trial was issued to `device_key`, is
    unexpired, unused, matches (job, workload, target, candidate) and, when the API leased it
    to a worker, `worker_id` is that worker; stamps the trial used in the same transaction.
    True: inserted; False: this very result was stored before (a retry). Raises
    `TrialRejected` (nothing written) otherwise; `plausible(rec)` is asked last, just before
    the insert, and may raise it too (a latency no device can reach). `confirm`: a valid
    result is a FARM record, served once a confirmation trial agrees."""
    now = now or utcnow()
    with store.session() as s:
        trial = s.get(m.IssuedTrial, rec.trial_id, with_for_update=True)
        lost = _LOST_ID.fullmatch(rec.trial_id)
        if trial is None and lost and Invalidity(rec.invalidity) is Invalidity.WORKER_LOST:
            return _lost_attempt(s, rec, lost["base"], device_key, now)
        if trial is None:
            raise TrialRejected("unknown_trial", f"trial {rec.trial_id!r} was never issued",
                                field="input.trial_id")
        _check(trial, rec, device_key)
        if trial.holder is not None and worker_id is not None and trial.holder != worker_id:
            raise TrialRejected("not_lease_holder", f"trial {rec.trial_id} is leased to another "
                                "worker; only the worker holding its lease may answer it",
                                field="input.trial_id")
        stored = s.scalar(select(m.Record).where(m.Record.trial_id == rec.trial_id))
        if stored is not None or trial.used_at is not None:
            if stored is not None and _same(stored, rec):
                trial.used_at = trial.used_at or now
                return False
            raise TrialRejected("trial_used", f"trial {rec.trial_id} already has a different "
                                "result", field="result")
        if trial.expires_at <= now:
            raise TrialRejected("unknown_trial", f"trial {rec.trial_id} expired at "
                                f"{trial.expires_at.isoformat()}", field="input.trial_id")
        if plausible is not None:
            plausible(rec)
        row = m.Record(**rec.columns(now))
        if trial.confirms is not None:  # kept beside the job's trials, not as one of them
            row.trust, row.confirms, row.job_id = m.Trust.CONFIRMATION.value, trial.confirms, None
            _judge(s, trial.confirms, rec)
        elif confirm and Invalidity(rec.invalidity) is Invalidity.OK:
            row.trust = m.Trust.FARM.value  # served once confirmed
        s.add(row)
        trial.used_at = now
        s.flush()
        return True


def _judge(s: Session, original: str, confirmation: NewRecord) -> None:
    """A confirmation's verdict on the farm record of trial `original`: a valid measurement
    confirms it at the slower of the two medians; a failed one (build, run, wrong answer, but
    not a lost worker) refutes it. A record judged before keeps its verdict."""
    row = s.scalar(select(m.Record).where(m.Record.trial_id == original).with_for_update())
    if row is None or row.trust != m.Trust.FARM.value:
        return
    inv = Invalidity(confirmation.invalidity)
    if inv is Invalidity.OK and confirmation.median_s is not None and row.median_s is not None:
        row.trust = m.Trust.CONFIRMED.value
        row.confirmed_s = max(float(row.median_s), float(confirmation.median_s))
    elif inv is not Invalidity.WORKER_LOST:
        row.trust = m.Trust.REFUTED.value


def _lost_attempt(s: Session, rec: NewRecord, base: str, device_key: str,
                  now: datetime) -> bool:
    """Insert the worker_lost record of a failed attempt at the issued trial whose id starts
    with `base` (of `rec`'s job and candidate); the trial itself stays unused."""
    same = m.IssuedTrial.trial_id.startswith(base, autoescape=True) if len(base) == 20 else (
        m.IssuedTrial.trial_id == base)
    trial = s.scalar(select(m.IssuedTrial).where(
        same, m.IssuedTrial.job_id == rec.job_id, m.IssuedTrial.cand_hash == rec.cand_hash)
        .limit(1))
    if trial is None:
        raise TrialRejected("unknown_trial", f"{rec.trial_id!r} is an attempt at no issued "
                            "trial", field="input.trial_id")
    _check(trial, rec, device_key)
    if trial.expires_at <= now:
        raise TrialRejected("unknown_trial", f"trial {trial.trial_id} expired at "
                            f"{trial.expires_at.isoformat()}", field="input.trial_id")
    stored = s.scalar(select(m.Record).where(m.Record.trial_id == rec.trial_id))
    if stored is not None:
        if _same(stored, rec):
            return False
        raise TrialRejected("trial_used", f"attempt {rec.trial_id} already has a different "
                            "result", field="result")
    attempts = s.scalar(select(func.count()).select_from(m.Record).where(
        m.Record.trial_id.startswith(f"{base}-lost-", autoescape=True),
        m.Record.job_id == rec.job_id)) or 0
    if attempts >= MAX_LOST_ATTEMPTS:
        raise TrialRejected("trial_used", f"trial {trial.trial_id} already has {attempts} "
                            "failed attempts recorded", field="input.trial_id")
    s.add(m.Record(**rec.columns(now)))
    s.flush()
    return True
