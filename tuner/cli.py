"""`tunefarm` command line: tune, best, records, spaces, db upgrade (the service's commands are
in `tuner/cli_service.py`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.config import get_settings
from tuner.errors import TunefarmError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="tunefarm: autotuning of tensor programs on Apache TVM.")
db_app = typer.Typer(no_args_is_help=True, help="Tuning database maintenance.")
app.add_typer(db_app, name="db")
console = Console()
err = Console(stderr=True)

DbOpt = Annotated[str | None, typer.Option("--db", help="Database URL (default: TUNEFARM_DATABASE_URL, "
                                                         "else SQLite in the user data directory).")]
OpArg = Annotated[str, typer.Argument(help="matmul, dense, batch_matmul, conv2d, depthwise_conv2d, "
                                           "softmax, dense_int8, or tir")]
ShapeOpt = Annotated[str | None, typer.Option("--shape", help="Op shape, e.g. 512,512,512 (M,N,K).")]
ParamOpt = Annotated[list[str] | None, typer.Option("--param", "-p", help="Op parameter key=value "
                                                    "(stride, padding, dilation, layout, dtype).")]
TargetOpt = Annotated[str, typer.Option("--target", help='"host" (this CPU) or a JSON target dict.')]
ScriptOpt = Annotated[Path | None, typer.Option("--tvmscript", help="TVMScript file (op 'tir').")]


def _store(db: str | None) -> Any:
    from tuner.db.store import Store

    return Store(db or get_settings().resolved_database_url())


def _workload(op: str, shape: str | None, params: list[str] | None, tvmscript: Path | None) -> Any:
    from tuner.errors import SpecError
    from tuner.workloads import from_cli, parse_spec

    if op == "tir":
        if tvmscript is None:
            raise SpecError("op 'tir' needs --tvmscript FILE", field="tvmscript")
        return parse_spec({"op": "tir", "tvmscript": tvmscript.read_text()})
    if shape is None:
        raise SpecError(f"--shape is required for op {op!r}", field="shape")
    kv: dict[str, str] = {}
    for item in params or []:
        if "=" not in item:
            raise SpecError(f"expected key=value, got {item!r}", field="param")
        k, v = item.split("=", 1)
        kv[k.strip()] = v.strip()
    return from_cli(op, shape, kv)


def _target(spec: str, *, runnable_here: bool = False) -> dict[str, Any]:
    from tuner import tvm_api as tv
    from tuner.errors import TargetError

    d = tv.target_to_dict(tv.make_target(spec))
    if runnable_here:
        host_triple = str(tv.tvm_ffi.get_global_func("target.llvm_get_system_triple")())
        triple = d.get("mtriple", host_triple)
        if d["kind"] != "llvm" or triple.split("-")[0] != host_triple.split("-")[0]:
            raise TargetError(f"{json.dumps(d)} does not run on this machine ({host_triple}): "
                              "local tuning measures here; use a worker on such a board",
                              field="target")
    return d


def _fail(exc: TunefarmError) -> None:
    err.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


@app.command()
def tune(
    op: OpArg,
    shape: ShapeOpt = None, param: ParamOpt = None, tvmscript: ScriptOpt = None,
    target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(min=1, help="Trial budget of the job.")] = 64,
    device_key: Annotated[str, typer.Option(help="Board class measured on.")] = "local",
    space: Annotated[str, typer.Option(help="Search space: a template name, 'auto' (MetaSchedule's "
                                            "generated space) or 'default' (the best that applies).")] = "default",
    batch_size: Annotated[int | None, typer.Option(min=1)] = None,
    early_stop: Annotated[int | None, typer.Option(min=1, help="Stop after N trials without a new best.")] = None,
    seed: Annotated[int | None, typer.Option(help="Search seed (default TUNEFARM_SEED, else 0).")] = None,
    fresh: Annotated[bool, typer.Option(help="Start a new job instead of resuming the last one.")] = False,
    cache_flush: Annotated[bool | None, typer.Option(help="Flush CPU caches before every timed run.")] = None,
    db: DbOpt = None,
) -> None:
    """Tune a workload on this machine; resumes the same job if it was interrupted."""
    from tuner import tvm_api as tv
    from tuner.measure import MeasureOptions
    from tuner.search.loop import Tuner, TuneRequest
    from workers.local import LocalMeasurer

    s = get_settings()
    try:
        wl = _workload(op, shape, param, tvmscript)
        tgt = _target(target, runnable_here=True)
        threads = s.num_threads or int(tgt.get("num-cores") or 1)
        opts = MeasureOptions(min_repeat_ms=s.min_repeat_ms, repeats=s.repeats,
                              cache_flush=s.cache_flush if cache_flush is None else cache_flush,
                              build_timeout_s=s.build_timeout_s, run_timeout_s=s.run_timeout_s,
                              num_threads=threads)
        req = TuneRequest(workload=wl, target=tgt, trials=trials, device_key=device_key, space=space,
                          batch_size=batch_size or s.batch_size, early_stop=early_stop,
                          seed=seed if seed is not None else (s.seed or 0),
                          fresh=fresh, options=opts)
        store = _store(db)
    except TunefarmError as exc:
        _fail(exc)
        return
    console.print(f"[bold]{wl.description}[/]  key {wl.key}  on {json.dumps(tgt)}  ({tv.tvm_version()})")
    columns = [TextColumn("[bold blue]tuning"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}  {task.fields[gflops]} GFLOPS  {task.fields[last]}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as bar, LocalMeasurer() as measurer:
        task = bar.add_task("tune", total=trials, best="-", gflops="-", last="")

        def on_progress(p: Any) -> None:
            last = "" if p.last is None else str(p.last.invalidity)
            bar.update(task, completed=p.done, best=_fmt_s(p.best_s),
                       gflops=f"{p.best_gflops:.1f}" if p.best_gflops else "-",
                       last=p.message or last)

        try:
            summary = Tuner(store, measurer, on_progress=on_progress).run(req)
        except TunefarmError as exc:
            _fail(exc)
            return
    table = Table(title="tuning summary", show_header=False)
    for k, v in [("job", summary.job_id), ("workload", wl.key), ("stopped", summary.stop_reason),
                 ("trials in job", f"{summary.trials_done}/{trials}"),
                 ("measured now", str(summary.measured_now)),
                 ("skipped (already measured)", str(summary.skipped_duplicates)),
                 ("outcomes", ", ".join(f"{k}={v}" for k, v in sorted(summary.counts.items()))),
                 ("best latency", _fmt_s(summary.best_s)),
                 ("best GFLOPS", f"{summary.best_gflops:.1f}" if summary.best_gflops else "-"),
                 ("wall time", f"{summary.wall_s:.1f} s")]:
        table.add_row(k, v)
    console.print(table)


@app.command()
def best(
    op: Annotated[str, typer.Argument()], shape: ShapeOpt = None, param: ParamOpt = None,
    tvmscript: ScriptOpt = None, target: TargetOpt = "host",
    device_key: Annotated[str, typer.Option()] = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Print the best known schedule of a workload on a target."""
    from tuner.records import best_record

    try:
        wl = _workload(op, shape, param, tvmscript)
        rec = best_record(_store(db), wl, _target(target), device_key)
    except TunefarmError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(json.dumps(rec, indent=2) + "\n")
        return
    cv = f"{rec['cv'] * 100:.1f}%" if rec["cv"] is not None else "-"
    console.print(f"[bold]{wl.description}[/] on {json.dumps(rec['target'])} ({rec['device_key']})",
                  highlight=False)
    gf = f"{rec['gflops']:.1f} GFLOPS" if rec["gflops"] else "- GFLOPS"
    console.print(f"best: {_fmt_s(rec['latency_s'])}  {gf}  "
                  f"(cv {cv}, trial {rec['trial_id']}, space {rec['space']})", highlight=False)
    console.print(rec["schedule_python"], markup=False, highlight=False, soft_wrap=True)


@app.command()
def records(
    op: Annotated[str | None, typer.Argument()] = None, shape: ShapeOpt = None,
    param: ParamOpt = None, tvmscript: ScriptOpt = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False, db: DbOpt = None,
) -> None:
    """List tuning records, newest first (all workloads, or one)."""
    from tuner.records import list_records

    try:
        wl = _workload(op, shape, param, tvmscript) if op else None
        rows = list_records(_store(db), wl, limit=limit)
    except TunefarmError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("trial", "workload", "invalidity", "median", "GFLOPS", "worker", "measured")
    for r in rows:
        table.add_row(r["trial_id"][:12], r["workload"], r["invalidity"], _fmt_s(r["latency_s"]),
                      f"{r['gflops']:.1f}" if r["gflops"] else "-", r["worker"] or "-",
                      r["measured_at"][:19])
    console.print(table)


@app.command()
def spaces(
    op: Annotated[str | None, typer.Argument(help="Only the spaces that serve this op.")] = None,
) -> None:
    """Describe the search spaces (templates and their knobs, and 'auto') as JSON."""
    from schedules import registry

    if op is None:
        out = [registry.describe(n) for n in registry.space_names() if n != "default"]
    else:
        out = registry.describe_op(op)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the tuning database schema to the newest revision."""
    from tuner.db.store import Store

    try:
        store = Store(db or get_settings().resolved_database_url(), auto_upgrade=False)
        store.upgrade()
        console.print(f"database at revision {store.current_revision()}")
    except TunefarmError as exc:
        _fail(exc)


def main() -> None:
    app()


from tuner import cli_service  # noqa: E402,F401  - registers serve, tuner, worker, submit, up, token
