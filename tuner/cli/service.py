"""`tunefarm` commands of the service: serve, tuner, worker, submit, up, token. Plain
functions; `tuner/cli/__init__.py` registers them on the app. This is where the processes are
composed: the API app, the tuner service and the worker agent are imported only here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tuner.cli import common, service_jobs
from tuner.cli.common import (
    DbOpt,
    TargetOpt,
    console,
    err,
    fail,
    host_port,
    open_store,
    target_arg,
)
from tuner.cli.service_jobs import ApiOpt, TokenOpt, client_token
from tuner.cli.tokens import token_file, up_tokens
from tuner.core.config import Settings, get_settings
from tuner.core.errors import TunefarmError

if TYPE_CHECKING:
    from api.client import Client

RedisOpt = Annotated[str | None, typer.Option(
    "--redis", help="Redis URL (default: TUNEFARM_REDIS_URL).")]
MetricsPortOpt = Annotated[int | None, typer.Option(
    "--metrics-port", min=0, max=65535,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (default: TUNEFARM_METRICS_PORT; "
         "0: none).")]
MetricsHostOpt = Annotated[str | None, typer.Option(
    "--metrics-host", help="Bind address of the metrics endpoint (default: TUNEFARM_METRICS_HOST, "
                           "127.0.0.1; 0.0.0.0 for a scraper on another host).")]


def _log_setup() -> None:
    """Service processes log to stderr, one line per event (TUNEFARM_LOG_LEVEL, default INFO), as
    text or as JSON objects with the job and trial ids (TUNEFARM_LOG_FORMAT=json)."""
    from tuner.core import logs

    logs.setup(get_settings().log_format, os.environ.get("TUNEFARM_LOG_LEVEL", "INFO"))


def _settings(db: str | None = None, redis: str | None = None) -> Settings:
    s = get_settings()
    return s.model_copy(update={k: v for k, v in (("database_url", db), ("redis_url", redis)) if v})


def _check_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise TunefarmError(f"Redis at {url} is not reachable ({exc}): start redis-server or set "
                            "TUNEFARM_REDIS_URL") from exc
    finally:
        client.close()


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (TUNEFARM_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (TUNEFARM_API_PORT).")] = None,
    db: DbOpt = None, redis: RedisOpt = None,
) -> None:
    """Run the REST API (FastAPI on uvicorn)."""
    from api.app import serve as serve_api

    s = _settings(db, redis)
    if s.log_format == "json":  # the app's and uvicorn's records as JSON objects
        _log_setup()
    try:
        open_store(s.database_url)  # migrates the schema once, before the server starts
    except TunefarmError as exc:
        fail(exc)
    serve_api(s, host=host, port=port)


def tuner_cmd(db: DbOpt = None, redis: RedisOpt = None, metrics_port: MetricsPortOpt = None,
              metrics_host: MetricsHostOpt = None) -> None:
    """Run search loops for queued jobs (several tuner processes may run)."""
    from workers import service_metrics as metrics
    from workers.tuner_service import run_tuner

    _log_setup()
    s = _settings(db, redis)
    server = None
    try:
        _check_redis(s.redis_url)
        server = metrics.start(s, metrics_port, metrics_host)
        run_tuner(store_url=s.resolved_database_url(), redis_url=s.redis_url, prefix=s.redis_prefix)
    except TunefarmError as exc:
        fail(exc)
    finally:
        if server is not None:
            server.close()


def worker(
    device_key: Annotated[str, typer.Option(help="Board class this worker measures on.")] = "local",
    target: TargetOpt = "host",
    name: Annotated[str | None, typer.Option(help="Worker name (default host:pid).")] = None,
    rpc_tracker: Annotated[str | None, typer.Option(
        help="HOST:PORT of a TVM RPC tracker: build here, run on its boards (RPC mode).")] = None,
    rpc_key: Annotated[str | None, typer.Option(
        help="Tracker key of the boards (default: the device key).")] = None,
    concurrency: Annotated[int, typer.Option(
        min=1, help="Entries taken at once (built in parallel, run one at a time per "
                    "board).")] = 1,
    api: ApiOpt = None, token: TokenOpt = None,
    metrics_port: MetricsPortOpt = None, metrics_host: MetricsHostOpt = None,
) -> None:
    """Measure candidates for a device key: on this machine (local mode), or on the boards of a
    TVM RPC tracker (--rpc-tracker). The worker needs only the API (--api) and a worker token:
    it takes its work, posts its results and heartbeats over HTTP (no Redis, no database)."""
    from workers import agent_metrics as metrics
    from workers.agent import run_worker

    _log_setup()
    s = get_settings()
    server = None
    try:
        tracker = host_port(rpc_tracker) if rpc_tracker else None
        tgt = target_arg(target, runnable_here=tracker is None)
        tok = client_token(token)
        server = metrics.start(s, metrics_port, metrics_host)
        run_worker(api_url=api or s.api_url, token=tok, device_key=device_key, target=tgt,
                   name=name, concurrency=concurrency, rpc_tracker=tracker, rpc_key=rpc_key)
    except TunefarmError as exc:
        fail(exc)
    finally:
        if server is not None:
            server.close()


def _job_body(op: str, shape: str | None, param: list[str] | None, tvmscript: Path | None,
              target: str, **rest: Any) -> dict[str, Any]:
    wl = common.workload_arg(op, shape, param, tvmscript)  # checked here; the server again
    tgt: object = target if target.strip() == "host" else json.loads(target)
    return {"workload": wl.spec, "target": tgt, **{k: v for k, v in rest.items() if v is not None}}


def submit(
    op: common.OpArg,
    shape: common.ShapeOpt = None, param: common.ParamOpt = None,
    tvmscript: common.ScriptOpt = None, target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(min=1)] = 64,
    device_key: Annotated[str, typer.Option()] = "local",
    space: Annotated[str, typer.Option()] = "default",
    wall_budget_s: common.WallBudgetOpt = None, batch_size: common.BatchSizeOpt = None,
    seed: common.SeedOpt = None, early_stop: common.EarlyStopOpt = None,
    follow: Annotated[bool, typer.Option(help="Follow progress until the job ends.")] = True,
    idempotency_key: Annotated[str | None, typer.Option(help="Retry-safe submission key.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Submit a tuning job to the service and follow its progress."""
    from api.client import ApiError, Client

    try:
        body = _job_body(op, shape, param, tvmscript, target, trials=trials,
                         device_key=device_key, space=space, wall_budget_s=wall_budget_s,
                         batch_size=batch_size, seed=seed, early_stop=early_stop)
        client = Client(api or get_settings().api_url, client_token(token))
        job = client.submit_job(body, idempotency_key=idempotency_key)
    except json.JSONDecodeError as exc:
        fail(TunefarmError(f"--target: not JSON ({exc})"))
    except (TunefarmError, ApiError) as exc:
        fail(exc if isinstance(exc, TunefarmError) else TunefarmError(str(exc)))
    # with --no-follow stdout holds the id alone (for scripts); the rest goes to stderr
    (console if follow else err).print(
        Text.assemble("job ", (str(job["id"]), "bold"), f" {job['state']}: "
                      f"{job['workload_key']} on {json.dumps(job['target'])} "
                      f"({job['device_key']})"), highlight=False)
    err.print(f"watch it at {client.base_url}/ui#/jobs/{job['id']}", highlight=False)
    _warn_without_workers(client, job["device_key"])
    if not follow:
        sys.stdout.write(job["id"] + "\n")
        return
    service_jobs.finish(client, job)


def _warn_without_workers(client: Client, device_key: str) -> None:
    """Say so when no live worker serves the job's device key (it would wait, then fail)."""
    from api.client import ApiError

    try:
        workers = client.list_workers()
    except ApiError:
        return
    if not any(w.get("device_key") == device_key and w.get("state") in ("idle", "busy")
               for w in workers):
        err.print(f"warning: no live worker serves device key {device_key!r}: the job waits "
                  f"until one does (start one with `tunefarm worker --device-key {device_key}`) "
                  f"and fails after TUNEFARM_NO_WORKER_TIMEOUT_S without one", highlight=False)


def up(
    host: Annotated[str, typer.Option(help="API bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    device_key: Annotated[str, typer.Option(help="Device key of the local worker.")] = "local",
    db: DbOpt = None, redis: RedisOpt = None,
) -> None:
    """Start the API, one tuner and one local worker on this host (Ctrl-C stops all three).
    With TUNEFARM_METRICS_PORT=N, the tuner serves /metrics on port N and the worker on N+1."""
    from api.client import wait_ready

    s = _settings(db, redis)
    try:
        _check_redis(s.redis_url)
        store = open_store(s.resolved_database_url())
        toks, reused = up_tokens(store, token_file().parent, device_key)
    except TunefarmError as exc:
        fail(exc)
    user_tok, worker_tok = toks["user"], toks["worker"]
    api_url = f"http://{host}:{port}"
    # the worker gets the API and its token only: no database or Redis credentials
    env = {k: v for k, v in os.environ.items() if k not in (
        "TUNEFARM_DATABASE_URL", "TUNEFARM_REDIS_URL", "TUNEFARM_TOKEN")}
    env["TUNEFARM_API_URL"] = api_url
    internal = {"TUNEFARM_DATABASE_URL": s.resolved_database_url(),
                "TUNEFARM_REDIS_URL": s.redis_url}
    cli = [sys.executable, "-m", "tuner"]
    # TUNEFARM_METRICS_PORT=N: the tuner's metrics on N, the worker's on N+1 (not both on N)
    mport = s.metrics_port
    specs = [("api", [*cli, "serve", "--host", host, "--port", str(port)], internal),
             ("tuner", [*cli, "tuner", "--metrics-port", str(mport)], internal),
             ("worker", [*cli, "worker", "--device-key", device_key, "--metrics-port",
                         str(mport + 1 if mport else 0)], {"TUNEFARM_TOKEN": worker_tok})]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    relays: list[threading.Thread] = []
    try:
        for name, cmd, extra in specs:  # the API first: the worker registers with it
            # each line the process writes is relayed with its name in front (three processes
            # write to one terminal); unbuffered, so that its lines come as they are written
            procs[name] = subprocess.Popen(
                cmd, env={**env, **extra, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            relays.append(_relay(name, procs[name]))
            if name == "api" and not wait_ready(api_url, timeout_s=120,
                                                alive=lambda: procs["api"].poll() is None):
                err.print(f"the API did not become ready at {api_url}; stopping",
                          style="bold red")
                raise typer.Exit(1)
        # one write, not wrapped: a script (or a test) that sees the first line sees the token
        console.print(f"tunefarm is up: API {api_url} (docs {api_url}/v1/docs, dashboard "
                      f"{api_url}/ui), 1 tuner, 1 worker ({device_key}); database "
                      f"{store.safe_url}\nuser token {'reused from' if reused else 'saved to'} "
                      f"{token_file()} (`tunefarm submit` uses it):", soft_wrap=True)
        sys.stdout.write(user_tok + "\n")
        sys.stdout.flush()
        _wait(procs)
    finally:
        _stop(procs)
        for t in relays:  # their last lines (a worker's "stopped") before `up` returns
            t.join(timeout=5)


PREFIX_WIDTH = len("worker")


def _relay(name: str, proc: subprocess.Popen[bytes]) -> threading.Thread:
    """A thread copying `proc`'s output to ours, each line as `name | line`."""
    prefix = f"{name:<{PREFIX_WIDTH}} | ".encode()

    def copy() -> None:
        assert proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):  # our stdout closed: nothing to copy to
            for line in iter(proc.stdout.readline, b""):
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()

    thread = threading.Thread(target=copy, daemon=True, name=f"relay-{name}")
    thread.start()
    return thread


def _wait(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    stop = {"now": False}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop["now"] = True

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: it may arrive ignored
        signal.signal(sig, on_signal)
    while not stop["now"]:
        for name, p in procs.items():
            if p.poll() is not None:
                err.print(f"{name} exited with code {p.returncode}; stopping", style="bold red")
                return
        time.sleep(0.5)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group, the last started first (a worker drains and reports to the
    API before the API goes), then SIGKILL what is left after 20 s."""
    for p in reversed(procs.values()):
        _signal_group(p, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=20)
        _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)
