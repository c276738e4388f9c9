"""What the model job routes do, apart from HTTP: submit (vet every task's PrimFunc like a `tir`
workload, create the model job through `tuner.db.model_jobs`, start its first round), read,
list and cancel. Ownership is the job routes' (`api.job_service.may_see`): another owner's model job
is a 404 like a missing one."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import redis

from tuner.core.errors import NotFound, SpecError
from tuner.db import jobs as jobs_db
from tuner.db import model_jobs
from tuner.db.jobs import JobOptions
from tuner.db.model_jobs import ModelRow, NewModel, NewTask
from tuner.db.tables import JobState, utcnow
from tuner.db.tokens import Principal, Scope
from tuner.model.rounds import gradient_plan
from tuner.queue import events, mark_cancelled
from tuner.queue.streams import enqueue
from tuner.workloads import Workload, prime_parser

from .context import ApiContext
from .errors import ApiProblem
from .job_service import check_cores, request_hash
from .schemas import ModelCreate, ModelTaskCreate

log = logging.getLogger(__name__)

PARSERS = 4  # TVMScript parser children at once for one submission


def _workloads(ctx: ApiContext, tasks: list[ModelTaskCreate], who: str) -> list[Workload]:
    """Each task's PrimFunc, parsed in throwaway children (a chunk of tasks per child, within
    the API's parse gate and `who`'s parse budget); the first bad one is a 422 naming
    `tasks.<i>.<field>`."""
    specs = [{"op": "tir", "tvmscript": t.tvmscript} for t in tasks]

    def parse(i: int) -> Workload:
        try:
            return ctx.resolver.workload(specs[i])
        except SpecError as exc:
            inner = (exc.field or "tvmscript").removeprefix("workload.")
            raise type(exc)(exc.detail, field=f"tasks.{i}.{inner}") from exc

    new = [t.tvmscript for t, spec in zip(tasks, specs, strict=True)
           if not ctx.resolver.knows(spec)]
    with ctx.resolver.gate.admit(who, len(new)):
        prime_parser(new)  # one child a chunk of tasks, not one each
        with ThreadPoolExecutor(max_workers=PARSERS) as pool:
            return list(pool.map(parse, range(len(tasks))))


def submit(ctx: ApiContext, body: ModelCreate, idempotency_key: str | None,
           principal: Principal) -> tuple[ModelRow, bool]:
    """Validate everything, create the model job (within the owner's quotas: it counts as one
    job with its whole budget), start its first round and tell the tuners. Returns the model
    job and whether this request created it (False: a replay of its Idempotency-Key)."""
    rhash = request_hash(body)
    quotas = jobs_db.Quotas.from_settings(ctx.settings)
    quotas.check_job(body.round_trials)
    # quotas before any work: parsing a model's tasks costs a child per 16 of them
    quotas.precheck_new(ctx.store, principal.owner, body.trials, idempotency_key, model=True)
    tgt = ctx.resolver.target(body.target)
    check_cores(ctx, tgt.as_dict, body.device_key)
    workloads = _workloads(ctx, body.tasks, principal.owner)
    resolved = ctx.resolver.tasks(workloads, tgt, body.device_key, body.space)
    tref = ctx.resolver.target_ref(tgt, body.device_key)  # memoized: the tasks' own
    tasks = [NewTask(t.name, t.weight, r.workload_id, r.workload.key, r.space)
             for t, r in zip(body.tasks, resolved, strict=True)]
    started = utcnow()
    model = model_jobs.create_model(ctx.store, NewModel(
        name=body.name, owner=principal.owner, target=tref, space=body.space,
        trials=body.trials, round_trials=body.round_trials,
        options=JobOptions.from_settings(ctx.settings, batch_size=body.batch_size,
                                         seed=body.seed),
        tasks=tasks, wall_budget_s=body.wall_budget_s, idempotency_key=idempotency_key,
        request_hash=rhash), guard=quotas.guard(ctx.store.dialect, principal.owner, body.trials))
    if idempotency_key is not None and model.request_hash != rhash:
        raise ApiProblem("idempotency_conflict",
                         f"Idempotency-Key {idempotency_key!r} was already used for a different "
                         f"request (model job {model.id}); use a new key for a new model job",
                         model_id=model.id)
    created = model.created_at >= started
    if created:
        advance(ctx, model.id)
        log.info("model job %s submitted: %d tasks on %s, %d trials", model.id, len(tasks),
                 tref.key, body.trials)
        model = model_jobs.get_model(ctx.store, model.id)
    return model, created


def advance(ctx: ApiContext, model_id: str) -> None:
    """Start the model job's next round if none is in flight, and wake the tuners for it."""
    step = model_jobs.advance(ctx.store, model_id, gradient_plan)
    if step.started and step.job_id is not None:
        try:
            enqueue(ctx.sync_redis, ctx.keys.jobs, {"job_id": step.job_id})
        except (redis.RedisError, OSError) as exc:  # tuners also claim from SQL
            log.warning("model job %s: round %s not enqueued (Redis: %s)", model_id,
                        step.job_id, exc)


def get(ctx: ApiContext, model_id: str, principal: Principal) -> ModelRow:
    """The model job, if `principal` may see it (its owner, or an admin)."""
    model = model_jobs.get_model(ctx.store, model_id)  # NotFound: a 404
    if principal.scope is not Scope.ADMIN and model.owner != principal.owner:
        raise NotFound(f"no model job {model_id!r}")  # as if it did not exist
    return model


def cancel(ctx: ApiContext, model_id: str, principal: Principal) -> ModelRow:
    """Idempotent: the model job is CANCELLED at once; its round in flight is cancelled like
    any job (a running task job stops after its current candidate)."""
    get(ctx, model_id, principal)
    model, active = model_jobs.cancel_model(ctx.store, model_id)
    for job_id in active:
        job = jobs_db.request_cancel(ctx.store, job_id)
        if job.state in (JobState.CANCELLED, JobState.CANCELLING):
            mark_cancelled(ctx.sync_redis, ctx.keys, job_id)
            events.publish(ctx.sync_redis, ctx.keys, job_id, "state", {"state": str(job.state)})
    return model_jobs.get_model(ctx.store, model.id)
