"""The service's jobs from the command line (a token and the API URL, like `submit`):

    tunefarm jobs [--state S] [--limit N] [--json]   the caller's jobs, newest first
    tunefarm follow ID                                a job's progress until it ends
    tunefarm cancel ID                                stop a job (queued: at once)

Ctrl-C while following detaches: the job goes on on the service, and the message says how to
watch it again or stop it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.cli.common import console, err, fail, fmt_s
from tuner.core.config import get_settings
from tuner.core.errors import TunefarmError

if TYPE_CHECKING:
    from api.client import Client

T = TypeVar("T")

ApiOpt = Annotated[str | None, typer.Option(
    "--api", help="API base URL (default: TUNEFARM_API_URL).")]
TokenOpt = Annotated[str | None, typer.Option(
    "--token", help="Bearer token (default: TUNEFARM_TOKEN, else the one `tunefarm up` saved).")]
JobIdArg = Annotated[str, typer.Argument(help="The job's id (as `submit` printed it).")]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def client_token(token: str | None) -> str:
    """The token of a command that calls the API: --token, TUNEFARM_TOKEN, or `up`'s."""
    from tuner.cli.tokens import token_file

    tok = token or get_settings().token
    if not tok and token_file().exists():
        tok = token_file().read_text().strip()
    if not tok:
        raise TunefarmError("no API token: pass --token, set TUNEFARM_TOKEN, or create one with "
                            "`tunefarm token create --scope user`")
    return tok


def client(api: str | None, token: str | None) -> Client:
    from api.client import Client

    return Client(api or get_settings().api_url, client_token(token))


def _calling(what: Callable[[], T]) -> T:
    """`what()`, an API error a one-line failure."""
    from api.client import ApiError

    try:
        return what()
    except ApiError as exc:
        fail(TunefarmError(str(exc)))
    except TunefarmError as exc:
        fail(exc)


def jobs(state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
         limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
         as_json: Annotated[bool, typer.Option("--json", help="One JSON object per job.")] = False,
         api: ApiOpt = None, token: TokenOpt = None) -> None:
    """The jobs you submitted to the service, newest first."""
    page = _calling(lambda: client(api, token).list_jobs(state=state, limit=limit))
    items = page.get("items", [])
    if as_json:
        for job in items:  # JSON lines: one object a line
            sys.stdout.write(json.dumps(job) + "\n")
        return
    table = Table("id", "state", "workload", "space", "device", "trials", "best", "created")
    for j in items:
        best = j.get("best") or {}
        table.add_row(j["id"], j["state"], j["workload_key"], j.get("space", ""),
                      j.get("device_key", ""), f"{j['trials_done']}/{j['trials']}",
                      fmt_s(best.get("latency_s")), j["created_at"][:19])
    console.print(table if items else "no jobs" + (f" in state {state}" if state else ""))


def follow(job_id: JobIdArg, api: ApiOpt = None, token: TokenOpt = None) -> None:
    """Follow a service job's progress until it ends (exit 0 if it succeeded)."""
    c = _calling(lambda: client(api, token))
    job = _calling(lambda: c.get_job(job_id))
    finish(c, job)


def cancel(job_id: JobIdArg, api: ApiOpt = None, token: TokenOpt = None) -> None:
    """Cancel a service job: a queued one at once, a running one after its current batch."""
    job = _calling(lambda: client(api, token).cancel_job(job_id))
    console.print(f"job {job['id']}: {job['state']}", highlight=False)


def finish(c: Client, job: dict[str, Any]) -> None:
    """Follow `job` to its end, print how it ended, exit 0 if it succeeded. Ctrl-C detaches."""
    try:
        final = job if job["state"] in TERMINAL else _follow(c, job)
    except KeyboardInterrupt:
        err.print(f"detached: job {job['id']} goes on on the service; `tunefarm follow "
                  f"{job['id']}` watches it again, `tunefarm cancel {job['id']}` stops it",
                  highlight=False)
        raise typer.Exit(130) from None
    best = final.get("best") or {}
    gf = f"  {best['gflops']:.1f} GFLOPS" if best.get("gflops") else ""
    console.print(f"{final['state']}: {final['trials_done']}/{final['trials']} trials, best "
                  f"{fmt_s(best.get('latency_s'))}{gf}" +
                  (f"  error: {final['error']}" if final.get("error") else ""), highlight=False)
    raise typer.Exit(0 if final["state"] == "SUCCEEDED" else 1)


def _follow(c: Client, job: dict[str, Any]) -> dict[str, Any]:
    columns = [TextColumn("[bold blue]{task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}  {task.fields[gflops]} GFLOPS"),
               TimeElapsedColumn()]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("job", total=job["trials"], completed=job.get("trials_done", 0),
                            state=job["state"], best="-", gflops="-")
        for _id, kind, data in c.events(job["id"]):
            if kind == "progress":
                bar.update(task, completed=data.get("done", 0), best=fmt_s(data.get("best_s")),
                           gflops=f"{data['best_gflops']:.1f}" if data.get("best_gflops") else "-")
            elif kind == "state":
                bar.update(task, state=data.get("state", "?"))
                if data.get("state") in TERMINAL:
                    break
    return dict(c.get_job(job["id"]))
