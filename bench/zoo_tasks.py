"""`python -m bench tasks [--scale full] [--only bert,swin]`: each zoo model's tasks and the space
`tune-model` gives each, without tuning anything.

Per task: its relax name, its weight (calls per inference), its FLOP count, and what serves it:
an expert template (its name), MetaSchedule's generated space (`auto`: no template applies), or
relax's default loops (`default schedule`: the task was refused, with the reason). The same
steps as a model job: `torch.export`, relax's frontend, `tuner.model.pipeline.partition` and
`extract`, `tuner.model.job.vet_tasks`, then `schedules.registry.resolve("default", ...)` on the
host target. Writes a Markdown table per model and a one-line count per model (stdout, and
`--out DIR/tasks.md`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any


def _rows(name: str, scale: str, target: dict[str, Any]) -> list[tuple[str, int, float, str]]:
    import torch

    from bench.zoo import ZOO
    from schedules.registry import resolve
    from tuner.core import tvm_api as tv
    from tuner.model.job import vet_tasks
    from tuner.model.pipeline import extract, partition

    net, inputs = ZOO[name].make(scale)
    with torch.no_grad():
        program = torch.export.export(net, inputs)
    part = partition(tv.relax_from_exported_program(program), target)
    tasks = extract(part, target)
    kept, workloads, refused = vet_tasks(tasks)
    tgt = tv.make_target(target)
    rows = [(t.name, t.weight, wl.flops, resolve("default", wl, tgt))
            for t, wl in zip(kept, workloads, strict=True)]
    rows += [(u.name, u.weight, 0.0, f"default schedule ({u.reason})") for u in refused]
    return rows


def kind_of(space: str) -> str:
    return "default" if space.startswith("default") else "auto" if space == "auto" else "template"


def main(argv: list[str]) -> int:
    from bench.zoo import ZOO

    p = argparse.ArgumentParser(prog="python -m bench tasks", description=__doc__.split("\n")[0])
    p.add_argument("--scale", choices=["small", "full"], default="full")
    p.add_argument("--only", default="", help="comma-separated zoo model names (default: all)")
    p.add_argument("--out", type=Path, default=None, help="also write DIR/tasks.md")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        p.error(f"unknown zoo models: {', '.join(unknown)}; known: {', '.join(ZOO)}")
    from tuner.core import tvm_api as tv

    target = tv.host_target_dict()
    lines = [f"# Tasks of the zoo models ({args.scale}), target {target}", ""]
    summary = ["| model | tasks | template | auto | default schedule |",
               "|---|---:|---:|---:|---:|"]
    for name in names:
        rows = _rows(name, args.scale, target)
        count = Counter(kind_of(space) for *_, space in rows)
        summary.append(f"| {name} | {len(rows)} | {count['template']} | {count['auto']} | "
                       f"{count['default']} |")
        lines += [f"## {name}: {len(rows)} tasks", "", "| task | calls | MFLOP | space |",
                  "|---|---:|---:|---|"]
        lines += [f"| {task} | {calls} | {flops / 1e6:.1f} | {space} |"
                  for task, calls, flops, space in rows]
        lines.append("")
        print(summary[-1], flush=True)
    text = "\n".join([*lines, "## Summary", "", *summary, ""])
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tasks.md").write_text(text)
    return 0
