"""One way to create a job: `tunefarm tune` (the embedded search) and POST /v1/jobs go through
`tuner.db.jobs.create_job`, so the same request stores the same options; workloads are
registered through `tuner.db.register_workload`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tuner.core.errors import TunefarmError
from tuner.db import JobState, Store, register_workload
from tuner.db import jobs as jobs_db

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
MATMUL = {"op": "matmul", "shape": [64, 64, 64]}


class _Stopped(TunefarmError):
    """Raised right after the embedded path created its job: no tuning in these tests."""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Settings from a clean environment (the CLI reads the cached `get_settings()`)."""
    from tuner.core.config import get_settings

    for name in ("TUNEFARM_SEED", "TUNEFARM_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def _cli_job(db_url: str, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> Any:
    """The job `tunefarm tune matmul --shape 64,64,64 ARGS` creates (the search stops at once)."""
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.search import Tuner

    made: list[Any] = []
    create = Tuner._job

    def job_then_stop(self: Tuner, req: Any, wid: int, tref: Any) -> Any:
        made.append(create(self, req, wid, tref))
        raise _Stopped("stopped after creating the job")

    class _NoMeasurer:  # no sandbox processes: nothing is measured
        def __enter__(self) -> _NoMeasurer:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(Tuner, "_job", job_then_stop)
    monkeypatch.setattr("tuner.measure.local.LocalMeasurer", _NoMeasurer)
    out = CliRunner().invoke(app, ["tune", "matmul", "--shape", "64,64,64", "--trials", "8",
                                   "--db", db_url, *args])
    assert len(made) == 1, (out.output, out.exception)
    return made[0]


def _api_job(db_url: str, redis_url: str, redis_prefix: str, body: dict[str, Any]) -> Any:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.core.config import Settings
    from tuner.db.tokens import create_token

    settings = Settings(database_url=db_url, redis_url=redis_url, redis_prefix=redis_prefix)
    with TestClient(create_app(settings)) as client:
        app: Any = client.app
        token = create_token(app.state.ctx.store, "user", name="test")
        resp = client.post("/v1/jobs", json={"workload": MATMUL, "target": "host", "trials": 8,
                                             **body},
                           headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 202, resp.text
    return resp.json()


@pytest.mark.parametrize(("env_vars", "cli_args", "body", "options"), [
    ({}, [], {}, {"batch_size": 16, "seed": 0}),
    ({"TUNEFARM_SEED": "7", "TUNEFARM_BATCH_SIZE": "8"}, [], {}, {"batch_size": 8, "seed": 7}),
    ({"TUNEFARM_SEED": "7"}, ["--batch-size", "4", "--seed", "3", "--early-stop", "5"],
     {"batch_size": 4, "seed": 3, "early_stop": 5}, {"batch_size": 4, "seed": 3, "early_stop": 5}),
])
def test_cli_and_api_store_the_same_options(
        db_url: str, redis_url: str, redis_prefix: str, env: pytest.MonkeyPatch,
        env_vars: dict[str, str], cli_args: list[str], body: dict[str, Any],
        options: dict[str, Any]) -> None:
    for name, value in env_vars.items():
        env.setenv(name, value)
    cli = _cli_job(db_url, env, cli_args)
    api = _api_job(db_url, redis_url, redis_prefix, body)
    assert cli.options == api["options"] == options
    with Store(db_url) as store:
        stored = store.get_job(api["id"])
        assert stored is not None and stored.options == cli.options
        assert (cli.space, cli.trials) == (stored.space, stored.trials)
        assert cli.job_key == stored.job_key  # the same workload, target and space
    assert cli.lease_owner == jobs_db.LOCAL_OWNER and cli.state is JobState.QUEUED
    assert stored.lease_owner is None and stored.state is JobState.QUEUED


def _local_job(store: Store) -> jobs_db.NewJob:
    """What `tunefarm tune matmul --shape 64,64,64 --trials 4` asks `create_job` for."""
    from tuner.workloads import parse_spec

    wl = parse_spec(MATMUL)
    wid = register_workload(store, wl)
    tref = store.ensure_target('{"kind": "llvm"}', "local")
    return jobs_db.NewJob(workload_id=wid, workload_key=wl.key, target=tref, space="s",
                          trials=4, options=jobs_db.JobOptions(batch_size=2, seed=1),
                          lease_owner=jobs_db.LOCAL_OWNER, resume=True)


def test_create_job_resumes_the_latest_job_of_its_key(store: Store) -> None:
    new = _local_job(store)
    first = jobs_db.create_job(store, new)
    again = jobs_db.create_job(store, replace(new, trials=9))
    assert again.id == first.id and again.trials == 9  # resumed, budget extended
    fresh = jobs_db.create_job(store, replace(new, resume=False))
    assert fresh.id != first.id and fresh.job_key == first.job_key
    assert jobs_db.create_job(store, new).id == fresh.id  # the latest one is resumed


@pytest.mark.parametrize("ended", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_a_resumed_cli_job_is_never_claimed_by_a_service_tuner(store: Store,
                                                               ended: JobState) -> None:
    """`tunefarm up` beside `tunefarm tune` on one database: the CLI job that ended (or was
    interrupted) and is resumed stays the CLI's; the service tuner takes only its own."""
    new = _local_job(store)
    job = jobs_db.create_job(store, new)
    store.set_job_state(job.id, JobState.RUNNING)
    store.set_job_state(job.id, ended)
    assert store.get_job(job.id).lease_owner == jobs_db.LOCAL_OWNER  # type: ignore[union-attr]
    again = jobs_db.create_job(store, replace(new, trials=8))  # `tune` again: resumed
    assert again.id == job.id
    store.set_job_state(job.id, JobState.QUEUED, reopen=True)  # as the search loop reopens it
    assert jobs_db.claim(store, "tuner-1", 30.0) is None
    # a job stored before, its local lease freed when it ended: resuming takes it back
    with store.session() as s:
        from tuner.db import tables as m

        s.get(m.Job, job.id).lease_owner = None  # type: ignore[union-attr]
    jobs_db.create_job(store, new)
    assert jobs_db.claim(store, "tuner-1", 30.0) is None
    # the service's own jobs are claimed as before
    api = jobs_db.create_job(store, replace(new, lease_owner=None, owner="alice", resume=False,
                                            state=JobState.QUEUED))
    claimed = jobs_db.claim(store, "tuner-1", 30.0)
    assert claimed is not None and claimed.id == api.id


def test_register_workload_is_idempotent_and_stores_the_canonical_spec(store: Store) -> None:
    from tuner.workloads import parse_spec

    wl = parse_spec(MATMUL)
    wid = register_workload(store, wl)
    assert register_workload(store, wl) == wid
    row = store.get_workload(wid)
    assert row is not None and row.key == wl.key and row.spec_json == wl.spec_json()
    assert row.shash == wl.shash() and row.flops == wl.flops
    assert json.loads(row.spec_json) == wl.spec
