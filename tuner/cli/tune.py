"""`tunefarm` commands of the embedded tuner: tune (on this machine), best, records, spaces,
db upgrade. Plain functions; `tuner/cli/__init__.py` registers them on the app."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tuner.cli.common import (
    BatchSizeOpt,
    DbOpt,
    EarlyStopOpt,
    OpArg,
    ParamOpt,
    ScriptOpt,
    SeedOpt,
    ShapeOpt,
    TargetOpt,
    WallBudgetOpt,
    console,
    err,
    fail,
    fmt_s,
    host_port,
    open_store,
    rate,
    target_arg,
    workload_arg,
)
from tuner.core.config import get_settings
from tuner.core.errors import TunefarmError

if TYPE_CHECKING:
    from tuner.search.request import Progress as SearchProgress


def tune(
    op: OpArg,
    shape: ShapeOpt = None, param: ParamOpt = None, tvmscript: ScriptOpt = None,
    target: TargetOpt = "host",
    trials: Annotated[int, typer.Option(min=1, help="Trial budget of the job.")] = 64,
    device_key: Annotated[str, typer.Option(help="Board class measured on.")] = "local",
    space: Annotated[str, typer.Option(
        help="Search space: a template name, 'auto' (MetaSchedule's generated space) or "
             "'default' (the best that applies).")] = "default",
    batch_size: BatchSizeOpt = None, early_stop: EarlyStopOpt = None, seed: SeedOpt = None,
    wall_budget_s: WallBudgetOpt = None,
    rpc_tracker: Annotated[str | None, typer.Option(
        help="HOST:PORT of a TVM RPC tracker: build here, time on its boards of --device-key "
             "(an emulated Arm board: tunefarm board up).")] = None,
    fresh: Annotated[bool, typer.Option(
        help="Start a new job instead of resuming the last one.")] = False,
    cache_flush: Annotated[bool | None, typer.Option(
        help="Flush CPU caches before every timed run.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the summary as JSON on stdout (the progress goes to stderr).")
    ] = False,
    db: DbOpt = None,
) -> None:
    """Tune a workload on this machine; resumes the same job if it was interrupted."""
    from tuner.core import tvm_api as tv
    from tuner.measure import MeasureOptions, Measurer
    from tuner.measure.local import LocalMeasurer
    from tuner.measure.rpc import RpcMeasurer
    from tuner.search import Tuner, TuneRequest

    s = get_settings()
    try:
        wl = workload_arg(op, shape, param, tvmscript)
        tracker = host_port(rpc_tracker) if rpc_tracker else None
        tgt = target_arg(target, runnable_here=tracker is None)
        opts = MeasureOptions.from_settings(s, tgt, cache_flush=cache_flush)
        req = TuneRequest(workload=wl, target=tgt, trials=trials, device_key=device_key,
                          space=space, batch_size=s.job_batch_size(batch_size),
                          early_stop=early_stop, seed=s.job_seed(seed), fresh=fresh, options=opts)
        store = open_store(db)
    except TunefarmError as exc:
        fail(exc)
    out = err if as_json else console
    out.print(Text.assemble((wl.description, "bold"), f"  key {wl.key}  on {json.dumps(tgt)}  "
                            f"({tv.tvm_version()})"))
    unit, rate_of = rate(wl.flops, tv.param_bytes(wl.mod()), device_key)
    columns = [TextColumn("[bold blue]tuning"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}  {task.fields[rate]} " + unit + "  "
                          "{task.fields[last]}"),
               TimeElapsedColumn()]
    if s.emulated(device_key):
        out.print(f"{device_key} is an emulated board: its timings say nothing about a real "
                  "board (its verification does)", style="yellow")
    measurer: Measurer = LocalMeasurer() if tracker is None else RpcMeasurer(
        *tracker, device_key, deadline_factor=s.deadline_factor(device_key))
    with Progress(*columns, console=out, transient=False) as bar, measurer:
        task = bar.add_task("tune", total=trials, best="-", rate="-", last="")

        def on_progress(p: SearchProgress) -> None:
            last = "" if p.last is None else str(p.last.invalidity)
            bar.update(task, completed=p.done, best=fmt_s(p.best_s), rate=rate_of(p.best_s),
                       last=p.message or last)

        try:
            started = time.monotonic()

            def over_time() -> str | None:
                if wall_budget_s is not None and time.monotonic() - started > wall_budget_s:
                    return f"wall budget of {wall_budget_s:g} s reached"
                return None

            summary = Tuner(store, measurer, on_progress=on_progress,
                            should_stop=over_time).run(req)
        except TunefarmError as exc:
            fail(exc)
    if as_json:  # each outcome a field, for scripts
        fields = dataclasses.asdict(summary)
        fields["outcomes"] = dict(sorted(fields.pop("counts").items()))
        sys.stdout.write(json.dumps({**fields, "trials": trials, "rate_unit": unit},
                                    indent=2) + "\n")
        return
    table = Table(title="tuning summary", show_header=False)
    for k, v in [("job", summary.job_id), ("workload", wl.key), ("stopped", summary.stop_reason),
                 ("trials in job", f"{summary.trials_done}/{trials}"),
                 ("measured now", str(summary.measured_now)),
                 ("skipped (already measured)", str(summary.skipped_duplicates)),
                 ("proposed again (dropped)", str(summary.reproposed)),
                 ("outcomes", ", ".join(f"{k}={v}" for k, v in sorted(summary.counts.items()))),
                 ("best latency", fmt_s(summary.best_s)),
                 (f"best {unit}", rate_of(summary.best_s)),
                 ("wall time", f"{summary.wall_s:.1f} s")]:
        table.add_row(k, v)
    console.print(table)


def best(
    op: Annotated[str, typer.Argument()], shape: ShapeOpt = None, param: ParamOpt = None,
    tvmscript: ScriptOpt = None, target: TargetOpt = "host",
    device_key: Annotated[str, typer.Option()] = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Print the best known schedule of a workload on a target."""
    from tuner.interop.records import best_record

    try:
        wl = workload_arg(op, shape, param, tvmscript)
        rec = best_record(open_store(db), wl, target_arg(target), device_key)
    except TunefarmError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(rec, indent=2) + "\n")
        return
    cv = f"{rec['cv'] * 100:.1f}%" if rec["cv"] is not None else "-"
    console.print(Text.assemble((wl.description, "bold"),
                                f" on {json.dumps(rec['target'])} ({rec['device_key']})"),
                  highlight=False)
    from tuner.core import tvm_api as tv

    unit, rate_of = rate(wl.flops, tv.param_bytes(wl.mod()), rec["device_key"])
    console.print(f"best: {fmt_s(rec['latency_s'])}  {rate_of(rec['latency_s'])} {unit}  "
                  f"(cv {cv}, trial {rec['trial_id']}, space {rec['space']})", highlight=False)
    if rec.get("emulated"):
        console.print(f"measured on an emulated board ({rec['device_key']}): verified there, "
                      "but its latency says nothing about a real board", style="yellow")
    console.print(rec["schedule_python"], markup=False, highlight=False, soft_wrap=True)


def records(
    op: Annotated[str | None, typer.Argument()] = None, shape: ShapeOpt = None,
    param: ParamOpt = None, tvmscript: ScriptOpt = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
    job: Annotated[str | None, typer.Option(help="Only the records of this job.")] = None,
    ok: Annotated[bool, typer.Option("--ok", help="Only valid measurements.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False, db: DbOpt = None,
) -> None:
    """List tuning records, newest first (all workloads, or one; of one job; valid only)."""
    from tuner.interop.records import list_records

    try:
        wl = workload_arg(op, shape, param, tvmscript) if op else None
        rows = list_records(open_store(db), wl, limit=limit, job_id=job, only_ok=ok)
    except TunefarmError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("trial", "workload", "invalidity", "median", "GFLOPS", "worker", "measured")
    for r in rows:
        table.add_row(r["trial_id"][:12], r["workload"], r["invalidity"], fmt_s(r["latency_s"]),
                      f"{r['gflops']:.1f}" if r["gflops"] else "-", r["worker"] or "-",
                      r["measured_at"][:19])
    console.print(table)


def spaces(
    op: Annotated[str | None, typer.Argument(help="Only the spaces that serve this op.")] = None,
    shape: ShapeOpt = None, param: ParamOpt = None, tvmscript: ScriptOpt = None,
    target: TargetOpt = "host",
) -> None:
    """Describe the search spaces (templates and their knobs, and 'auto') as JSON. With a
    workload (--shape, or --tvmscript for any PrimFunc): which templates apply to it on the
    target, their knobs for it, and why the others do not."""
    from schedules import registry
    from tuner.core import tvm_api as tv

    if shape is not None or tvmscript is not None:
        try:
            wl = workload_arg(op or "tir", shape, param, tvmscript)
            out = registry.explain(wl, tv.make_target(target_arg(target)))
        except TunefarmError as exc:
            fail(exc)
    elif op is None:
        out = [registry.describe(n) for n in registry.space_names() if n != "default"]
    else:
        out = registry.describe_op(op)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the tuning database schema to the newest revision."""
    from tuner.db.store import Store

    try:
        store = Store(db or get_settings().resolved_database_url(), auto_upgrade=False)
        store.upgrade()
        console.print(f"database at revision {store.current_revision()}")
    except TunefarmError as exc:
        fail(exc)
