"""Committing a worker's measurement: MeasureInput + MeasureResult -> one SQL record
(idempotent per trial id), then the best-cache invalidation and a "record" event."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from tuner.db.rows import NewRecord
from tuner.measure import Invalidity, MeasureInput, MeasureResult
from tuner.queue import events
from tuner.records import record_from

from . import best
from .context import ApiContext
from .errors import ApiProblem
from .schemas import ResultCreate

log = logging.getLogger(__name__)


def _invalid(detail: str, field: str) -> ApiProblem:
    return ApiProblem("validation_error", detail, field=field,
                      errors=[{"loc": ["body", *field.split(".")], "msg": detail,
                               "type": "value_error"}])


def _parse(body: ResultCreate) -> tuple[MeasureInput, MeasureResult]:
    try:
        inp = MeasureInput.from_json(json.dumps(body.input))
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"not a MeasureInput: {exc}", "input") from exc
    try:
        res = MeasureResult.from_json(json.dumps(body.result))
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"not a MeasureResult: {exc}", "result") from exc
    if not all(isinstance(x, int | float) and x >= 0 for x in res.latencies_s):
        raise _invalid("latencies_s must be non-negative numbers (seconds)", "result.latencies_s")
    if inp.trial_id != res.trial_id:
        raise _invalid(f"result is for trial {res.trial_id!r}, input for {inp.trial_id!r}",
                       "result.trial_id")
    return inp, res


def _record(ctx: ApiContext, inp: MeasureInput, res: MeasureResult) -> tuple[NewRecord, str]:
    """The record and its target key; checks the context names a known workload and target
    (a bad context must be a 422 the worker gives up on, not a database error it retries)."""
    try:
        rec = record_from(inp, res)
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"the input's context cannot make a record: {exc}", "input.context") from exc
    tref = ctx.resolver.target_by_id(rec.target_id)
    wrow = ctx.store.get_workload(rec.workload_id)
    if tref is None or wrow is None:
        what = "target" if tref is None else "workload"
        raise _invalid(f"the context names an unknown {what}", "input.context")
    if rec.job_id is not None and ctx.store.get_job(rec.job_id) is None:
        raise _invalid(f"the context names an unknown job {rec.job_id!r}", "input.context.job_id")
    if wrow.key != inp.workload_key:
        raise _invalid(f"workload_id {rec.workload_id} is {wrow.key}, not {inp.workload_key}",
                       "input.context.workload_id")
    return rec, tref.key


def commit(ctx: ApiContext, worker_id: str, body: ResultCreate) -> dict[str, Any]:
    inp, res = _parse(body)
    if res.worker is None:
        res = dataclasses.replace(res, worker=worker_id)
    rec, tkey = _record(ctx, inp, res)
    inserted = ctx.store.add_records([rec]) == 1
    if inserted:
        if res.invalidity is Invalidity.OK and res.median_s is not None:
            best.invalidate(ctx, inp.workload_key, tkey, res.median_s)
        if rec.job_id:
            events.publish(ctx.sync_redis, ctx.keys, rec.job_id, "record", {
                "trial_id": rec.trial_id, "invalidity": str(res.invalidity),
                "latency_s": res.median_s})
        log.info("trial %s of job %s from worker %s: %s", rec.trial_id, rec.job_id, worker_id,
                 res.invalidity)
    return {"trial_id": rec.trial_id, "inserted": inserted}
