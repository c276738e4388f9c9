"""tuner.db.trials on both databases: issuing is idempotent, a result is accepted once for its
issued trial, an identical retry is `False`, and a rejected result writes nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests.support.fakefarm import make_inputs, make_job, ok_result
from tuner.db import Store, trials
from tuner.db import tables as m
from tuner.db.rows import NewRecord
from tuner.measure import Invalidity, MeasureResult


def _rec(inp: Any, res: MeasureResult | None = None) -> NewRecord:
    return NewRecord.from_measurement(inp, res or ok_result(inp))


def test_issue_is_idempotent_and_extends_the_expiry(store: Store) -> None:
    job = make_job(store)
    inputs = make_inputs(job, 3)
    assert trials.issue(store, inputs + inputs[:1], "dev", ttl_s=60) == 3
    first = trials.issued(store, inputs[0].trial_id)
    assert first is not None and first.used_at is None
    assert (first.job_id, first.workload_id, first.target_id, first.device_key,
            first.cand_hash) == (job.id, job.workload_id, job.target_id, "dev",
                                 inputs[0].context["cand_hash"])  # type: ignore[index]
    assert trials.issue(store, inputs[:1], "dev", ttl_s=600) == 1  # enqueued again
    again = trials.issued(store, inputs[0].trial_id)
    assert again is not None and again.expires_at > first.expires_at + timedelta(seconds=500)
    with pytest.raises(ValueError, match="cannot be issued"):
        trials.issue(store, [replace(inputs[0], context=None)], "dev", ttl_s=60)


def test_a_result_is_accepted_once(store: Store) -> None:
    (inp,) = make_inputs(make_job(store), 1)
    trials.issue(store, [inp], "dev", ttl_s=60)
    rec = _rec(inp)
    assert trials.commit_result(store, rec, "dev") is True
    assert trials.commit_result(store, rec, "dev") is False  # the same post, retried
    used = trials.issued(store, inp.trial_id)
    assert used is not None and used.used_at is not None
    other = _rec(inp, MeasureResult(inp.trial_id, Invalidity.OK, (1e-12,)))
    with pytest.raises(trials.TrialRejected) as err:
        trials.commit_result(store, other, "dev")
    assert (err.value.code, err.value.field) == ("trial_used", "result")
    stored = store.record(inp.trial_id)
    assert store.count_records() == 1 and stored is not None
    assert stored.latencies == list(ok_result(inp).latencies_s)


@pytest.mark.parametrize("what, code, field", [
    ("never issued", "unknown_trial", "input.trial_id"),
    ("expired", "unknown_trial", "input.trial_id"),
    ("device key", "trial_mismatch", "device_key"),
    ("cand_hash", "trial_mismatch", "input.context.cand_hash"),
    ("job_id", "trial_mismatch", "input.context.job_id"),
])
def test_a_rejected_result_writes_nothing(store: Store, what: str, code: str,
                                          field: str) -> None:
    job, other = make_job(store), make_job(store)
    (inp,) = make_inputs(job, 1)
    if what != "never issued":
        trials.issue(store, [inp], "dev", ttl_s=60)
    rec = _rec(inp)
    device = "other" if what == "device key" else "dev"
    if what == "expired":
        with store.session() as s:
            s.get(m.IssuedTrial, inp.trial_id).expires_at = m.utcnow() - timedelta(seconds=1)
    elif what == "cand_hash":
        rec = replace(rec, cand_hash="0" * 16)
    elif what == "job_id":
        rec = replace(rec, job_id=other.id)
    with pytest.raises(trials.TrialRejected) as err:
        trials.commit_result(store, rec, device)
    assert (err.value.code, err.value.field) == (code, field)
    assert store.count_records() == 0
    row = trials.issued(store, inp.trial_id)
    assert row is None or row.used_at is None


def test_failed_attempts_are_recorded_beside_the_trial(store: Store) -> None:
    """A worker_lost result under `<trial_id[:20]>-lost-<hex>` is recorded for an issued trial
    (of the worker's device key) without using it, at most MAX_LOST_ATTEMPTS times; under any
    other id, or with another outcome, it is an unknown trial."""
    job = make_job(store)
    (inp,) = make_inputs(job, 1, prefix="x" * 12)  # an id longer than 20 characters
    base = inp.trial_id[:20]
    lost = MeasureResult.failure("", Invalidity.WORKER_LOST, "board died")

    def attempt(suffix: str, res: MeasureResult = lost) -> NewRecord:
        tid = f"{base}-lost-{suffix}"
        return _rec(replace(inp, trial_id=tid), replace(res, trial_id=tid))

    with pytest.raises(trials.TrialRejected) as err:  # not issued yet
        trials.commit_result(store, attempt("a1"), "dev")
    assert err.value.code == "unknown_trial"
    trials.issue(store, [inp], "dev", ttl_s=60)
    assert trials.commit_result(store, attempt("a1"), "dev") is True
    assert trials.commit_result(store, attempt("a1"), "dev") is False  # retried
    with pytest.raises(trials.TrialRejected) as err:
        trials.commit_result(store, attempt("a2"), "other")
    assert (err.value.code, err.value.field) == ("trial_mismatch", "device_key")
    with pytest.raises(trials.TrialRejected) as err:  # only a failure may take an attempt id
        trials.commit_result(store, attempt("a3", ok_result(inp)), "dev")
    assert err.value.code == "unknown_trial"
    row = trials.issued(store, inp.trial_id)
    assert row is not None and row.used_at is None  # the real result is still to come
    for i in range(2, trials.MAX_LOST_ATTEMPTS + 1):
        assert trials.commit_result(store, attempt(f"{i:x}0"), "dev") is True
    with pytest.raises(trials.TrialRejected) as err:
        trials.commit_result(store, attempt("ff"), "dev")
    assert err.value.code == "trial_used"
    assert store.count_records() == trials.MAX_LOST_ATTEMPTS
    assert trials.commit_result(store, _rec(inp), "dev") is True
