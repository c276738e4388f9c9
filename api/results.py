"""Committing a worker's measurement: MeasureInput + MeasureResult -> one SQL record, accepted
only for a trial the tuner issued to the worker's device key (`tuner.db.trials`), then the
best-cache invalidation and a "record" event.

A post is checked in this order, and anything rejected writes nothing (no record, no cache
invalidation, no event):

    the worker      the caller's token registered `worker_id` (403 forbidden, 404 not_found)
    the body        a MeasureInput and a MeasureResult (422 validation_error), the input's
                    trial issued (409 unknown_trial), both of the same trial, latencies finite and
                    > 0 (1..MAX_SAMPLES of them for an ok result), a context naming a known job,
                    workload and target (422 validation_error, naming the field)
    the trial       issued and unexpired (409 unknown_trial), issued for this job, workload,
                    target, candidate and the worker's device key (409 trial_mismatch, naming
                    the field), leased to this worker when the API leased it to one (409
                    not_lease_holder), not answered yet (409 trial_used; the same result
                    posted again answers 200 `inserted: false`)
    the latency     plausible (422 implausible_latency): its fastest sample no faster than
                    `min_plausible_latency_s` nor than `max_plausible_ops_per_s` operations
                    per second for the workload's operations, nor than PEAK_MARGIN times the
                    device key's declared peak (`peak_gflops`) when one is declared

With TUNEFARM_CONFIRM_BEST, a valid result is stored as a farm record, served by GET /v1/best
only once a confirmation trial (the same input measured again, issued by the tuner) agrees; the
confirmation's result confirms it at the slower median or refutes it (`tuner.db.trials`), and
drops the cached best.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

from tuner.db import trials
from tuner.db.rows import NewRecord, check_knobs
from tuner.db.workers import WorkerRow
from tuner.interop.records import record_from
from tuner.measure import Invalidity, MeasureInput, MeasureResult
from tuner.queue import events

from . import best
from .context import ApiContext
from .errors import ApiProblem
from .schemas import ResultCreate, ResultPublic

log = logging.getLogger(__name__)

MAX_SAMPLES = 1000  # latencies per result
MAX_TEXT = 64 << 10  # characters of an error message
MAX_NAME = 64  # characters of context.space and context.tvm_version (their columns' size)
# a device key's declared fp32 peak (TUNEFARM_PEAK_GFLOPS) times this bounds any plausible
# operation rate: int8 and bf16 units run more operations a cycle than fp32 FMAs (AMX int8
# about 13x an AVX-512 core's fp32 on a Sapphire Rapids), and a peak may be declared low
PEAK_MARGIN = 16.0


def _invalid(detail: str, field: str) -> ApiProblem:
    return ApiProblem("validation_error", detail, field=field,
                      errors=[{"loc": ["body", *field.split(".")], "msg": detail,
                               "type": "value_error"}])


def _positive(x: object) -> bool:
    """A finite number of seconds above zero (not a bool)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    try:
        return math.isfinite(float(x)) and float(x) > 0
    except OverflowError:
        return False


def _check_result(res: MeasureResult) -> None:
    lat = res.latencies_s
    if len(lat) > MAX_SAMPLES:
        raise _invalid(f"at most {MAX_SAMPLES} latency samples, not {len(lat)}",
                       "result.latencies_s")
    if not all(_positive(x) for x in lat):
        raise _invalid("latencies_s must be finite numbers of seconds above 0",
                       "result.latencies_s")
    if res.invalidity is Invalidity.OK and not lat:
        raise _invalid("an ok result needs at least one latency sample", "result.latencies_s")
    if res.build_s is not None and not (_positive(res.build_s) or res.build_s == 0):
        raise _invalid("build_s must be a finite number of seconds, at least 0", "result.build_s")
    if res.max_abs_err is not None and not (_positive(res.max_abs_err) or res.max_abs_err == 0):
        raise _invalid("max_abs_err must be a finite number, at least 0", "result.max_abs_err")
    if res.error_msg is not None and (not isinstance(res.error_msg, str)
                                      or len(res.error_msg) > MAX_TEXT):
        raise _invalid(f"error_msg must be text of at most {MAX_TEXT} characters",
                       "result.error_msg")


def _parse(ctx: ApiContext, body: ResultCreate) -> tuple[MeasureInput, MeasureResult]:
    try:
        inp = MeasureInput.from_json(json.dumps(body.input))
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"not a MeasureInput: {exc}", "input") from exc
    try:
        res = MeasureResult.from_json(json.dumps(body.result))
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"not a MeasureResult: {exc}", "result") from exc
    for name in ("trial_id", "workload_key", "trace_json"):
        if not isinstance(getattr(inp, name), str):
            raise _invalid(f"{name} must be a string", f"input.{name}")
    if not isinstance(res.trial_id, str):
        raise _invalid("trial_id must be a string", "result.trial_id")
    if len(inp.trial_id) > 128 or not trials.known(ctx.store, inp.trial_id):
        raise ApiProblem("unknown_trial", f"trial {inp.trial_id[:128]!r} was never issued",
                         field="input.trial_id")
    if inp.trial_id != res.trial_id:
        raise _invalid(f"result is for trial {res.trial_id!r}, input for {inp.trial_id!r}",
                       "result.trial_id")
    _check_result(res)
    return inp, res


def _record(ctx: ApiContext, inp: MeasureInput,
            res: MeasureResult) -> tuple[NewRecord, str, int]:
    """The record, its target key and its workload's operation count; checks the context
    names a known workload and target (a bad context must be a 422 the worker gives up on, not
    a database error it retries)."""
    predicted = (inp.context or {}).get("predicted_s")
    if predicted is not None and not _positive(predicted):
        raise _invalid("must be a finite number of seconds above zero",
                       "input.context.predicted_s")
    try:
        check_knobs((inp.context or {}).get("knobs"))
    except ValueError as exc:
        raise _invalid(str(exc), "input.context.knobs") from exc
    try:
        rec = record_from(inp, res)
    except (TypeError, ValueError, KeyError) as exc:
        raise _invalid(f"the input's context cannot make a record: {exc}", "input.context") from exc
    if rec.job_id is not None and not isinstance(rec.job_id, str):
        raise _invalid("job_id must be a string", "input.context.job_id")
    for name in ("space", "tvm_version"):
        if len(getattr(rec, name)) > MAX_NAME:
            raise _invalid(f"{name} is longer than {MAX_NAME} characters", f"input.context.{name}")
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
    return rec, tref.key, wrow.flops


def commit(ctx: ApiContext, worker: WorkerRow, body: ResultCreate) -> ResultPublic:
    """Store the result `worker` (acting as itself: see `tuner.db.workers.acting_as`) posted
    for an issued trial; {"trial_id", "inserted"}. The record's `worker` is the result's (e.g.
    the RPC board that ran it), else the posting worker's id."""
    inp, res = _parse(ctx, body)
    if res.worker is None:
        res = dataclasses.replace(res, worker=worker.id)
    if not isinstance(res.worker, str) or len(res.worker) > 128:
        raise _invalid("worker must be text of at most 128 characters", "result.worker")
    rec, tkey, flops = _record(ctx, inp, res)

    def plausible(r: NewRecord) -> None:
        """No single worker sets a best no device can reach: the fastest sample must be at
        least `min_plausible_latency_s` and at most `max_plausible_ops_per_s` fast, and at
        most PEAK_MARGIN times the device key's declared fp32 peak (`peak_gflops`)."""
        if res.invalidity is not Invalidity.OK or not res.latencies_s:
            return
        fastest = min(res.latencies_s)
        limit, source = ctx.settings.max_plausible_ops_per_s, "any device"
        peak = ctx.settings.peak_gflops.get(worker.device_key)
        if peak and peak * 1e9 * PEAK_MARGIN < limit:
            limit = peak * 1e9 * PEAK_MARGIN
            source = (f"{PEAK_MARGIN:g}x the {peak:g} GFLOPS declared for device key "
                      f"{worker.device_key!r}")
        if fastest < ctx.settings.min_plausible_latency_s or flops / fastest > limit:
            raise trials.TrialRejected(
                "implausible_latency", f"a latency of {fastest:.3g} s is implausible for "
                f"{flops:.3g} operations (at most {limit:.3g} operations per second, "
                f"{source}, and at least {ctx.settings.min_plausible_latency_s:.3g} s a call)",
                field="result.latencies_s")

    try:
        inserted = trials.commit_result(ctx.store, rec, worker.device_key, plausible=plausible,
                                        worker_id=worker.id,
                                        confirm=ctx.settings.confirm_best)
    except trials.TrialRejected as exc:
        log.warning("worker %s: result for trial %s rejected (%s): %s", worker.id, rec.trial_id,
                    exc.code, exc.detail)
        raise ApiProblem(exc.code, exc.detail, field=exc.field) from exc
    if inserted:
        issued = trials.issued(ctx.store, rec.trial_id)
        confirms = issued.confirms if issued is not None else None
        if confirms is not None:  # a verdict on a farm record: the served best may change
            best.invalidate(ctx, inp.workload_key, tkey, None)
        elif res.invalidity is Invalidity.OK and res.median_s is not None:
            best.invalidate(ctx, inp.workload_key, tkey, res.median_s)
        if rec.job_id and confirms is None:  # a confirmation is none of the job's trials
            events.publish(ctx.sync_redis, ctx.keys, rec.job_id, "record", {
                "trial_id": rec.trial_id, "invalidity": str(res.invalidity),
                "latency_s": res.median_s, "worker": res.worker,
                "worker_name": worker.name if res.worker == worker.id else None,
                "build_s": res.build_s,
                "predicted_s": rec.predicted_s, "knobs": rec.knobs})
        log.info("trial %s of job %s from worker %s: %s", rec.trial_id, rec.job_id, worker.id,
                 res.invalidity)
    return ResultPublic(trial_id=rec.trial_id, inserted=inserted)
