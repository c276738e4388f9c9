"""`tunefarm model`: the farm's cost models, one per target (status, train). Plain functions;
`tuner/cli/__init__.py` registers them."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from tuner.cli.common import DbOpt, console, fail, open_store
from tuner.core.errors import SpecError, TunefarmError


def _target_text(target_json: str) -> str:
    t = json.loads(target_json)
    return " ".join(str(t[k]) for k in ("kind", "mcpu", "mtriple") if t.get(k))


def model_status(db: DbOpt = None) -> None:
    """Each target's cost model: version, rows learned, records not learned yet, last update,
    and its accuracy on the rows of its last update before it learned them (held out)."""
    from tuner.db import cost_models

    try:
        rows = cost_models.status(open_store(db))
    except TunefarmError as exc:
        fail(exc)
    table = Table("target", "records", "model", "updated", "held-out τ, top-1, top-5",
                  title="cost models")
    for st in rows:
        m = st.model
        if m is None:
            table.add_row(f"{_target_text(st.target_json)} [{st.device_key}]",
                          str(st.records), "-", "-", "-")
            continue
        kind = "full" if m.full else "incremental"
        acc = m.metrics
        table.add_row(
            f"{_target_text(st.target_json)} [{st.device_key}]", str(st.records),
            f"v{m.version} {kind}, {m.rows} rows, {m.objective}",
            m.created_at.strftime("%Y-%m-%d %H:%M"),
            f"{acc['kendall_tau']:.2f}, {acc['top1']:.0%}, {acc['top5']:.0%} "
            f"({acc['workloads']} workloads)" if acc else "-")
    console.print(table)
    if not rows:
        console.print("no records with features yet: tune something first")


def model_train(
    full: Annotated[bool, typer.Option(
        help="Refit on the newest records instead of an incremental update.")] = False,
    objective: Annotated[str, typer.Option(
        help="regression (relative throughput), pairwise or ndcg (ranking within a "
             "workload); another objective than the stored one refits.")] = "regression",
    db: DbOpt = None,
) -> None:
    """Update every target's cost model from the records stored since its latest version (what
    tuners do after each job); run it from cron or after importing records."""
    from tuner.db import cost_models
    from tuner.search import farm_model
    from tuner.search.costmodel import OBJECTIVES

    if objective not in OBJECTIVES:
        fail(SpecError(f"unknown objective {objective!r}: one of {', '.join(OBJECTIVES)}",
                       field="objective"))
    cfg = farm_model.FarmModelConfig(objective=objective)
    try:
        store = open_store(db)
        for st in cost_models.status(store):
            tref = store.get_target(st.target_id)
            if tref is None:
                continue
            saved = farm_model.refresh(store, tref, full=full, cfg=cfg)
            what = (f"version {saved.version} ({'full' if saved.full else 'incremental'}, "
                    f"{saved.rows} rows, {saved.train_s:.2f} s)" if saved else "up to date")
            console.print(f"{_target_text(st.target_json)} [{st.device_key}]: {what}",
                          highlight=False, soft_wrap=True)
    except TunefarmError as exc:
        fail(exc)
