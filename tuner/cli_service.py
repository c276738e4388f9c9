"""`tunefarm` commands of the service: serve, tuner, worker, submit, up, token create.

Registered on `tuner.cli.app` (imported at the end of `tuner/cli.py`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.cli import (DbOpt, OpArg, ParamOpt, ScriptOpt, ShapeOpt, TargetOpt, _fail, _fmt_s,
                       _store, _target, _workload, app, console, err)
from tuner.config import Settings, get_settings
from tuner.errors import TunefarmError

token_app = typer.Typer(no_args_is_help=True, help="API bearer tokens.")
app.add_typer(token_app, name="token")

RedisOpt = Annotated[str | None, typer.Option("--redis", help="Redis URL (default: TUNEFARM_REDIS_URL).")]
ApiOpt = Annotated[str | None, typer.Option("--api", help="API base URL (default: TUNEFARM_API_URL).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (default: TUNEFARM_TOKEN, "
                                                              "else the one `tunefarm up` saved).")]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _log_setup() -> None:
    """Service processes log to stderr, one line per event (TUNEFARM_LOG_LEVEL, default INFO)."""
    import logging

    level = os.environ.get("TUNEFARM_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise


def _settings(db: str | None = None, redis: str | None = None) -> Settings:
    s = get_settings()
    return s.model_copy(update={k: v for k, v in (("database_url", db), ("redis_url", redis)) if v})


def token_file() -> Path:
    return get_settings().data_dir / "token"


def _client_token(token: str | None) -> str:
    tok = token or get_settings().token
    if not tok and token_file().exists():
        tok = token_file().read_text().strip()
    if not tok:
        raise TunefarmError("no API token: pass --token, set TUNEFARM_TOKEN, or create one with "
                            "`tunefarm token create --scope user`")
    return tok


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


@token_app.command("create")
def token_create(
    scope: Annotated[str, typer.Option(help="user (jobs, best, spaces), worker (register, "
                                            "heartbeat, results) or admin (everything).")] = "user",
    name: Annotated[str, typer.Option(help="A label for the token.")] = "",
    db: DbOpt = None,
) -> None:
    """Create an API token; it is printed once, alone on the last line."""
    from tuner.db.tokens import create_token

    try:
        tok = create_token(_store(db), scope, name)
    except TunefarmError as exc:
        _fail(exc)
        return
    err.print(f"created a {scope} token{f' {name!r}' if name else ''}; store it now, it is not "
              "shown again:")
    sys.stdout.write(tok + "\n")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (TUNEFARM_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (TUNEFARM_API_PORT).")] = None,
    db: DbOpt = None, redis: RedisOpt = None,
) -> None:
    """Run the REST API (FastAPI on uvicorn)."""
    from api.app import serve as serve_api

    s = _settings(db, redis)
    try:
        _store(s.database_url)  # migrates the schema once, before the server starts
    except TunefarmError as exc:
        _fail(exc)
        return
    serve_api(s, host=host, port=port)


@app.command("tuner")
def tuner_cmd(db: DbOpt = None, redis: RedisOpt = None) -> None:
    """Run search loops for queued jobs (several tuner processes may run)."""
    from tuner.service.runner import run_tuner

    _log_setup()
    s = _settings(db, redis)
    try:
        _check_redis(s.redis_url)
        run_tuner(store_url=s.resolved_database_url(), redis_url=s.redis_url, prefix=s.redis_prefix)
    except TunefarmError as exc:
        _fail(exc)


@app.command()
def worker(
    device_key: Annotated[str, typer.Option(help="Board class this worker measures on.")] = "local",
    target: TargetOpt = "host",
    name: Annotated[str | None, typer.Option(help="Worker name (default host:pid).")] = None,
    rpc_tracker: Annotated[str | None, typer.Option(
        help="HOST:PORT of a TVM RPC tracker: build here, run on its boards (RPC mode).")] = None,
    rpc_key: Annotated[str | None, typer.Option(
        help="Tracker key of the boards (default: the device key).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Entries taken at once (built in "
                                                         "parallel, run one at a time per board).")] = 1,
    api: ApiOpt = None, token: TokenOpt = None, redis: RedisOpt = None,
) -> None:
    """Measure candidates for a device key: on this machine (local mode), or on the boards of a
    TVM RPC tracker (--rpc-tracker)."""
    from workers.agent import run_worker

    _log_setup()
    s = _settings(redis=redis)
    try:
        tracker = _host_port(rpc_tracker) if rpc_tracker else None
        tgt = _target(target, runnable_here=tracker is None)
        _check_redis(s.redis_url)
        run_worker(api_url=api or s.api_url, token=_client_token(token), redis_url=s.redis_url,
                   device_key=device_key, target=tgt, name=name, concurrency=concurrency,
                   rpc_tracker=tracker, rpc_key=rpc_key)
    except TunefarmError as exc:
        _fail(exc)


def _host_port(text: str) -> tuple[str, int]:
    from tuner.errors import SpecError

    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SpecError(f"expected HOST:PORT, got {text!r}", field="rpc-tracker")
    return host, int(port)


def _job_body(op: str, shape: str | None, param: list[str] | None, tvmscript: Path | None,
              target: str, **rest: Any) -> dict[str, Any]:
    wl = _workload(op, shape, param, tvmscript)  # checked here; the server checks again
    tgt: Any = target if target.strip() == "host" else json.loads(target)
    return {"workload": wl.spec, "target": tgt, **{k: v for k, v in rest.items() if v is not None}}


@app.command()
def submit(
    op: OpArg,
    shape: ShapeOpt = None, param: ParamOpt = None, tvmscript: ScriptOpt = None,
    target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(min=1)] = 64,
    device_key: Annotated[str, typer.Option()] = "local",
    space: Annotated[str, typer.Option()] = "default",
    wall_budget: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    follow: Annotated[bool, typer.Option(help="Follow progress until the job ends.")] = True,
    idempotency_key: Annotated[str | None, typer.Option(help="Retry-safe submission key.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Submit a tuning job to the service and follow its progress."""
    from api.client import ApiError, Client

    try:
        body = _job_body(op, shape, param, tvmscript, target, trials=trials,
                         device_key=device_key, space=space, wall_budget_s=wall_budget)
        client = Client(api or get_settings().api_url, _client_token(token))
        job = client.submit_job(body, idempotency_key=idempotency_key)
    except json.JSONDecodeError as exc:
        _fail(TunefarmError(f"--target: not JSON ({exc})"))
        return
    except (TunefarmError, ApiError) as exc:
        _fail(exc if isinstance(exc, TunefarmError) else TunefarmError(str(exc)))
        return
    console.print(f"job [bold]{job['id']}[/] {job['state']}: {job['workload_key']} on "
                  f"{json.dumps(job['target'])} ({job['device_key']})", highlight=False)
    if not follow:
        sys.stdout.write(job["id"] + "\n")
        return
    final = _follow(client, job)
    best = final.get("best") or {}
    gf = f"  {best['gflops']:.1f} GFLOPS" if best.get("gflops") else ""
    console.print(f"{final['state']}: {final['trials_done']}/{final['trials']} trials, best "
                  f"{_fmt_s(best.get('latency_s'))}{gf}" +
                  (f"  error: {final['error']}" if final.get("error") else ""), highlight=False)
    raise typer.Exit(0 if final["state"] == "SUCCEEDED" else 1)


def _follow(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    columns = [TextColumn("[bold blue]{task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}  {task.fields[gflops]} GFLOPS"), TimeElapsedColumn()]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("job", total=job["trials"], state=job["state"], best="-", gflops="-")
        for _id, kind, data in client.events(job["id"]):
            if kind == "progress":
                bar.update(task, completed=data.get("done", 0), best=_fmt_s(data.get("best_s")),
                           gflops=f"{data['best_gflops']:.1f}" if data.get("best_gflops") else "-")
            elif kind == "state":
                bar.update(task, state=data.get("state", "?"))
                if data.get("state") in TERMINAL:
                    break
    return client.get_job(job["id"])


@app.command()
def up(
    host: Annotated[str, typer.Option(help="API bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    device_key: Annotated[str, typer.Option(help="Device key of the local worker.")] = "local",
    db: DbOpt = None, redis: RedisOpt = None,
) -> None:
    """Start the API, one tuner and one local worker on this host (Ctrl-C stops all three)."""
    from api.client import wait_ready
    from tuner.db.tokens import create_token

    s = _settings(db, redis)
    try:
        _check_redis(s.redis_url)
        store = _store(s.resolved_database_url())
        user_tok = create_token(store, "user", "tunefarm up")
        worker_tok = create_token(store, "worker", "tunefarm up worker")
    except TunefarmError as exc:
        _fail(exc)
        return
    api_url = f"http://{host}:{port}"
    env = {**os.environ, "TUNEFARM_DATABASE_URL": s.resolved_database_url(),
           "TUNEFARM_REDIS_URL": s.redis_url, "TUNEFARM_API_URL": api_url}
    cli = [sys.executable, "-m", "tuner"]
    specs = [("api", [*cli, "serve", "--host", host, "--port", str(port)], {}),
             ("tuner", [*cli, "tuner"], {}),
             ("worker", [*cli, "worker", "--device-key", device_key], {"TUNEFARM_TOKEN": worker_tok})]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, cmd, extra in specs:  # the API first: the worker registers with it
            procs[name] = subprocess.Popen(cmd, env={**env, **extra}, start_new_session=True)
            if name == "api" and not wait_ready(api_url, timeout_s=120,
                                                alive=lambda: procs["api"].poll() is None):
                err.print(f"[bold red]the API did not become ready at {api_url}; stopping[/]")
                raise typer.Exit(1)
        token_file().parent.mkdir(parents=True, exist_ok=True)
        token_file().write_text(user_tok + "\n")
        token_file().chmod(0o600)
        console.print(f"tunefarm is up: API {api_url} (docs {api_url}/v1/docs), 1 tuner, 1 worker "
                      f"({device_key}); database {store.safe_url}")
        console.print(f"user token saved to {token_file()} (`tunefarm submit` uses it):")
        sys.stdout.write(user_tok + "\n")
        sys.stdout.flush()
        _wait(procs)
    finally:
        _stop(procs)


def _wait(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: it may arrive ignored
        signal.signal(sig, on_signal)
    while not stop["now"]:
        for name, p in procs.items():
            if p.poll() is not None:
                err.print(f"[bold red]{name} exited with code {p.returncode}; stopping[/]")
                return
        time.sleep(0.5)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group, the last started first (a worker drains and reports to the
    API before the API goes), then SIGKILL what is left after 20 s."""
    for p in reversed(procs.values()):
        _signal_group(p, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
