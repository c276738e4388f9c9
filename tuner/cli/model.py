"""`tunefarm` commands for whole models and for TVM interop: tune-model, build (the embedded
engine, on this machine), db export, db import. Plain functions; `tuner/cli/__init__.py`
registers them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tuner.cli.common import (
    BatchSizeOpt,
    DbOpt,
    SeedOpt,
    TargetOpt,
    WallBudgetOpt,
    console,
    fail,
    fmt_s,
    open_store,
    target_arg,
)
from tuner.cli.service_jobs import TERMINAL, TokenOpt, client_token
from tuner.core.config import get_settings
from tuner.core.errors import SpecError, TunefarmError

if TYPE_CHECKING:
    from tuner.core.tvm_api import ms
    from tuner.search.request import Progress as SearchProgress

ModelArg = Annotated[Path, typer.Argument(
    help="A torch.export program (.pt2), a Python file with model() [and example_inputs()], "
         "or a relax module in TVMScript.")]
ServiceOpt = Annotated[str | None, typer.Option(
    "--api", help="The service's base URL: run on its farm instead of this machine.")]
BuildApiOpt = Annotated[str | None, typer.Option(
    "--api", help="Read the tuned schedules from the service at this base URL (GET /v1/best) "
                  "instead of the SQL database.")]
FastMathOpt = Annotated[bool, typer.Option(
    "--fast-math", help="GELU's erf and tanh as vectorizable approximations (about 1e-6 "
                        "relative error); give it to tune-model and build alike.")]
DtypeOpt = Annotated[str, typer.Option(
    "--dtype", help="float32, or bfloat16: the model's linear layers on bf16 operands with "
                    "float32 sums (bf16 weights; the rest in float32); give it to tune-model "
                    "and build alike.")]


def _dtype(dtype: str) -> str:
    """`dtype`, or the command's error: checked first, before TVM or torch is imported or the
    model loaded."""
    from tuner.model import DTYPES

    if dtype not in DTYPES:
        fail(SpecError(f"--dtype {dtype!r}: a model is tuned in one of {', '.join(DTYPES)}",
                       field="dtype"))
    return dtype


def _tasks_table(tasks: list[Any], title: str) -> Table:
    table = Table("task", "calls", "trials", "best", "weighted", title=title)
    for t in tasks:
        weighted = fmt_s(t.best_s * t.weight) if t.best_s is not None else "-"
        table.add_row(t.name, str(t.weight), str(t.trials), fmt_s(t.best_s), weighted)
    return table


def tune_model(
    model: ModelArg, target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(min=1, help="Trial budget of the whole model.")] = 256,
    round_trials: Annotated[int, typer.Option(
        min=1, help="Trials one task gets per round of the task scheduler.")] = 16,
    device_key: Annotated[str, typer.Option(help="Board class measured on.")] = "local",
    seed: SeedOpt = None, wall_budget_s: WallBudgetOpt = None,
    batch_size: BatchSizeOpt = None,
    fast_math: FastMathOpt = False,
    dtype: DtypeOpt = "float32",
    db: DbOpt = None,
    api: ServiceOpt = None, token: TokenOpt = None,
    follow: Annotated[bool, typer.Option(
        help="With --api: follow the model job until it ends.")] = True,
) -> None:
    """Tune every task of a model, one budget spread by a gradient-based task scheduler: on
    this machine (run it again to go on after an interruption), or with --api on the service's
    farm (the tasks are extracted here; the service never sees the model file)."""
    dtype = _dtype(dtype)
    from tuner.measure import MeasureOptions
    from tuner.measure.local import LocalMeasurer
    from tuner.model.job import ModelProgress, ModelRequest, ModelTuner, vet_tasks
    from tuner.model.load import load_model
    from tuner.model.pipeline import extract, partition

    s = get_settings()
    try:
        tgt = target_arg(target, runnable_here=api is None)
        tasks = extract(partition(load_model(model), tgt, fast_math=fast_math, dtype=dtype), tgt)
        if not tasks:
            raise SpecError(f"{model} has no operator to tune", field="model")
        if api is not None:
            # the service refuses what the `tir` checks refuse: such tasks stay out of the job
            kept, _, refused = vet_tasks(tasks)
            if refused:
                console.print(_untuned_table(refused))
            if not kept:
                raise SpecError(f"{model}: no task of the model can be tuned", field="model")
            body = {"name": model.name, "target": tgt, "device_key": device_key,
                    "trials": trials, "round_trials": round_trials, "seed": seed,
                    "batch_size": batch_size, "wall_budget_s": wall_budget_s,
                    "tasks": [{"name": t.name, "weight": t.weight, "tvmscript": t.func.script()}
                              for t in kept]}
            _tune_on_service(api, token, {k: v for k, v in body.items() if v is not None},
                             follow)
            return
        store = open_store(db)
        req = ModelRequest(tasks=tasks, target=tgt, trials=trials, device_key=device_key,
                           name=model.name,
                           round_trials=round_trials, batch_size=s.job_batch_size(batch_size),
                           seed=s.job_seed(seed), wall_budget_s=wall_budget_s,
                           options=MeasureOptions.from_settings(s, tgt))
    except TunefarmError as exc:
        fail(exc)
    console.print(Text.assemble((str(model), "bold"), f": {len(tasks)} tasks, "
                                f"{sum(t.weight for t in tasks)} calls per run; {trials} trials"),
                  highlight=False, soft_wrap=True)

    def on_progress(p: ModelProgress) -> None:
        bars.console.print(f"[{p.trials:>5}/{p.total}] model estimate {fmt_s(p.estimate_s)}  "
                           f"{p.message}", highlight=False, soft_wrap=True)

    rounds: dict[int, Any] = {}  # round -> its bar

    def on_trial(rnd: int, name: str, p: SearchProgress) -> None:  # a live bar per round
        if rnd not in rounds:
            rounds[rnd] = bars.add_task(f"round {rnd} {name}", total=p.total, best="-")
        bars.update(rounds[rnd], completed=p.done, total=p.total, best=fmt_s(p.best_s))

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn()]
    with Progress(*columns, console=console) as bars, LocalMeasurer() as measurer:
        try:
            summary = ModelTuner(store, measurer, on_progress=on_progress,
                                 on_trial=on_trial).run(req)
        except TunefarmError as exc:
            fail(exc)
    if summary.tasks:
        console.print(_tasks_table(summary.tasks, "model tuning summary"))
    if summary.untuned:
        console.print(_untuned_table(summary.untuned))
    console.print(f"estimated model latency {fmt_s(summary.first_estimate_s)} -> "
                  f"{fmt_s(summary.estimate_s)}; {summary.trials} trials in {summary.rounds} "
                  f"rounds, {summary.wall_s:.1f} s ({summary.stop_reason})",
                  highlight=False, soft_wrap=True)


def _untuned_table(untuned: list[Any]) -> Table:
    table = Table("task", "calls", "why", title="tasks without a tuned schedule (relax's "
                  "default loops in the build)", title_style="bold yellow")
    for u in untuned:
        table.add_row(Text(u.name), str(u.weight), Text(u.reason))
    return table


def _tune_on_service(api: str, token: str | None, body: dict[str, Any], follow: bool) -> None:
    """Submit the extracted tasks as a model job (POST /v1/models) and follow it: a line each
    time the estimated model latency changes, the task table at the end."""
    import time

    from api.client import ApiError, Client

    try:
        client = Client(api, client_token(token))
        job = client.submit_model(body)
    except ApiError as exc:
        fail(TunefarmError(str(exc)))
    console.print(Text.assemble("model job ", (str(job["id"]), "bold"), f" {job['state']}: "
                                f"{len(job['tasks'])} tasks, {job['trials']} trials"),
                  highlight=False, soft_wrap=True)
    if not follow:
        sys.stdout.write(job["id"] + "\n")
        return
    shown: tuple[Any, ...] = ()
    while True:
        seen = (job["trials_done"], job["estimate_s"], job["message"])
        if seen != shown:
            console.print(f"[{job['trials_done']:>5}/{job['trials']}] model estimate "
                          f"{fmt_s(job['estimate_s'])}  {job['message']}", highlight=False,
                          soft_wrap=True)
            shown = seen
        if job["state"] in TERMINAL:
            break
        time.sleep(2.0)
        try:
            job = client.get_model(job["id"])
        except ApiError as exc:
            if not exc.transient:
                fail(TunefarmError(str(exc)))
    table = Table("task", "calls", "trials", "best", "weighted", title="model tuning summary")
    for t in job["tasks"]:
        best = t["best_s"]
        table.add_row(t["name"], str(t["weight"]), str(t["trials_done"]), fmt_s(best),
                      fmt_s(best * t["weight"]) if best is not None else "-")
    console.print(table)
    console.print(f"{job['state']}: {job['trials_done']} trials ({job['message']})",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(0 if job["state"] == "SUCCEEDED" else 1)


def build(
    model: ModelArg, target: TargetOpt = "host",
    output: Annotated[Path, typer.Option("-o", "--output", help="Library to write (.so).")] = Path(
        "model.so"),
    device_key: Annotated[str, typer.Option(help="Board class whose records to use.")] = "local",
    fast_math: FastMathOpt = False,
    dtype: DtypeOpt = "float32",
    db: DbOpt = None,
    api: BuildApiOpt = None, token: TokenOpt = None,
) -> None:
    """Compile a model with the tuned schedules of the database (relax VM executable): the SQL
    database, or with --api the service's (GET /v1/best: only a URL and a token needed)."""
    dtype = _dtype(dtype)
    from api.client import ApiError
    from tuner.model.load import load_model
    from tuner.model.pipeline import build as build_model

    try:
        tgt = target_arg(target)
        database: ms.database.PyDatabase
        if api is not None:
            from api.client.ms_database import RemoteDatabase

            database = RemoteDatabase(api, client_token(token), device_key)
        else:
            from tuner.interop.ms_database import TunefarmDatabase

            # the record `tunefarm best` and GET /v1/best show: the fastest by median time
            database = TunefarmDatabase(open_store(db), device_key, ranking="median")
        # `derived_object` makes either a MetaSchedule Database
        built = build_model(load_model(model), tgt, cast("ms.database.Database", database),
                            fast_math=fast_math, dtype=dtype)
    except TunefarmError as exc:
        fail(exc)
    except (ApiError, RuntimeError) as exc:  # RuntimeError: an ApiError raised across TVM's FFI
        fail(TunefarmError(f"the service's database failed: {exc}"))
    built.executable.export_library(str(output))
    tuned = len(built.tasks) - len(built.untuned)
    console.print(f"wrote {output}: {tuned} of {len(built.tasks)} tasks with a tuned schedule",
                  highlight=False, soft_wrap=True)
    cores = tgt.get("num-cores")
    if cores:  # TVM's runtime picks its own thread count otherwise (1.7x slower seen on 2 cores)
        console.print(f"run it with TVM_NUM_THREADS={cores} set: its schedules were tuned on "
                      f"{cores} threads, and TVM's runtime otherwise picks its own count",
                      highlight=False, soft_wrap=True)
    if built.untuned:
        table = Table("task", "calls", title="tasks without a record: relax's default loops "
                      "(one thread, no vectors)", title_style="bold yellow")
        for t in built.tasks:
            if t.name in built.untuned:
                table.add_row(Text(t.name), str(t.weight))
        console.print(table)
        share = built.untuned_share
        console.print(Text(f"warning: {share:.0%} of the model's operations run in tasks "
                           "without a tuned schedule" + (
                               ": the library is likely far slower than tuned; run tune-model "
                               "again with more --trials" if share >= 0.05 else ""),
                           style="bold yellow" if share >= 0.05 else "yellow"), soft_wrap=True)


def db_export(
    directory: Annotated[Path, typer.Argument(help="Directory to write.")],
    fmt: Annotated[str, typer.Option("--format", help="Only 'metaschedule'.")] = "metaschedule",
    db: DbOpt = None,
) -> None:
    """Write every record as a MetaSchedule JSONDatabase (database_workload.json and
    database_tuning_record.json), which ms.database.JSONDatabase loads."""
    from tuner.interop.ms_json import export_metaschedule

    if fmt != "metaschedule":
        fail(SpecError(f"unknown format {fmt!r}: only 'metaschedule'", field="format"))
    try:
        done = export_metaschedule(open_store(db), directory)
    except TunefarmError as exc:
        fail(exc)
    console.print(f"exported {done.written} records to {directory}",
                  highlight=False, soft_wrap=True)


def db_import(
    directory: Annotated[Path, typer.Argument(help="A MetaSchedule JSONDatabase directory.")],
    device_key: Annotated[str, typer.Option(help="Board class the records were measured on.")]
    = "local",
    db: DbOpt = None,
) -> None:
    """Merge a MetaSchedule JSONDatabase directory: every record kept, none added twice."""
    from tuner.interop.ms_json import import_metaschedule

    try:
        done = import_metaschedule(open_store(db), directory, device_key=device_key)
    except FileNotFoundError as exc:
        fail(SpecError(str(exc), field="directory"))
    except TunefarmError as exc:
        fail(exc)
    console.print(f"read {done.read} records from {directory}, added {done.written} "
                  f"({done.read - done.written} already stored)", highlight=False, soft_wrap=True)
