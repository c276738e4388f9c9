"""Tuning one workload twice at the same trial budget: with tunefarm (`Tuner` + `LocalMeasurer`,
a fresh SQLite database per workload) and with plain `ms.tune_tir` (a JSON database per
workload). Both measure candidates with the same protocol (TVM `time_evaluator`: `repeats` runs
of about `min_repeat_ms` each, the same threads), so wall times are comparable: MetaSchedule's
runner lets the evaluator size every repeat (number=1, growing), tunefarm's sandbox sizes the
calls per repeat once from a probe (tuner.measure.evaluate.calls_per_repeat).

Each returns a JSON-able summary whose `best_trace` (trace JSON, postprocessing included) is what
the timing step replays; the summary is also written to the workload's directory so that
`--reuse-tuning` can time again without tuning again.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .curves import INVALID_S, best_so_far, callbacks, stamps, tunefarm_db_curve

# MetaSchedule's docs: batches of 32 (with 64 trials, two batches, the second chosen by a cost
# model trained on the first, not one untrained batch of 64)
MS_TRIALS_PER_ITER = 32


def _settings() -> Any:
    from tuner.core.config import get_settings

    return get_settings()


def ms_builder_runner(threads: int) -> tuple[Any, Any]:
    """MetaSchedule's builder and runner as both suites give them: the build `default_build`
    does without its ~11 s tensor-intrinsic import per pool (`bench.msbuild`), one build
    process per thread, tunefarm's build timeout, and tunefarm's timing protocol. With the
    stock LocalBuilder's 30 s timeout, a task of one candidate (a reshape, the GELU) timed out
    in its fresh pool's start-up on a 2-core Zen 4 and MetaSchedule kept no kernel for it."""
    from tuner.core import tvm_api as tv

    from .msbuild import fast_build

    s = _settings()
    builder = tv.ms.builder.LocalBuilder(f_build=fast_build, max_workers=threads,
                                         timeout_sec=s.build_timeout_s)
    runner = tv.ms.runner.LocalRunner(
        timeout_sec=s.run_timeout_s,
        evaluator_config=tv.ms.runner.EvaluatorConfig(
            number=1, repeat=s.repeats, min_repeat_ms=int(s.min_repeat_ms),
            enable_cpu_cache_flush=s.cache_flush))
    return builder, runner


def resolve_space(wl: Any, target: dict[str, Any], space: str) -> str:
    """The concrete space tunefarm uses for `space` ("default": the first template that applies)."""
    from schedules.registry import resolve
    from tuner.core import tvm_api as tv

    return resolve(space, wl, tv.make_target(target))


def tune_tunefarm(wl: Any, target: dict[str, Any], trials: int, work_dir: Path, *,
                  threads: int, space: str = "default", seed: int = 0,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    from tuner.core.errors import NotFound
    from tuner.db import Store
    from tuner.interop.records import best_record
    from tuner.measure import MeasureOptions
    from tuner.measure.local import LocalMeasurer
    from tuner.search import Progress, Tuner, TuneRequest

    s = _settings()
    work_dir.mkdir(parents=True, exist_ok=True)
    db_path = work_dir / "tunefarm.db"
    for p in work_dir.glob("tunefarm.db*"):  # fresh: no history, no transfer from other runs
        p.unlink()
    # the settings' protocol, on the threads MetaSchedule gets too
    opts = replace(MeasureOptions.from_settings(s, target), num_threads=threads)
    req = TuneRequest(workload=wl, target=target, trials=trials, space=space,
                      batch_size=s.batch_size, seed=seed, fresh=True, options=opts)
    resolved = resolve_space(wl, target, space)
    step = max(1, trials // 8)

    def progress(p: Progress) -> None:
        if p.last is not None and (p.done % step == 0 or p.done == p.total):
            best = f"{p.best_s * 1e3:.4g} ms" if p.best_s else "-"
            log(f"    tunefarm {p.done}/{p.total}  best {best}")

    store = Store(f"sqlite:///{db_path}")
    try:
        t0 = time.monotonic()
        with LocalMeasurer(log_dir=work_dir / "sandbox-logs") as measurer:
            summary = Tuner(store, measurer, on_progress=progress).run(req)
        wall = time.monotonic() - t0
        try:
            rec = best_record(store, wl, target)
            trace = json.dumps(rec["trace"])
        except NotFound:
            trace = None
    finally:
        store.close()
    counts = dict(summary.counts)
    return {"tuner": "tunefarm", "space": resolved, "wall_s": wall, "trials": trials,
            "trials_done": summary.trials_done, "valid": counts.get("ok", 0), "counts": counts,
            "stop_reason": summary.stop_reason, "best_s_tuning": summary.best_s,
            "best_trace": trace, "db": str(db_path), "curve": tunefarm_db_curve(db_path)}


def tune_metaschedule(wl: Any, target: dict[str, Any], trials: int, work_dir: Path, *,
                      threads: int, seed: int = 0,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    from tuner.core import tvm_api as tv

    ms = tv.ms
    ms_dir = work_dir / "metaschedule"
    shutil.rmtree(ms_dir, ignore_errors=True)
    ms_dir.mkdir(parents=True)
    tgt = tv.make_target(target)
    mod = wl.mod()
    builder, runner = ms_builder_runner(threads)
    database = ms.database.JSONDatabase(work_dir=str(ms_dir))
    tv.load_tensor_intrins("x86")  # the default CPU rules name its VNNI and AVX-512 dots
    log(f"    metaschedule: tune_tir, {trials} trials")
    stamped = stamps()
    t0 = time.monotonic()
    db = ms.tune_tir(mod=mod, target=tgt, work_dir=str(ms_dir), max_trials_global=trials,
                     num_trials_per_iter=MS_TRIALS_PER_ITER, builder=builder, runner=runner,
                     database=database, measure_callbacks=callbacks(stamped),
                     num_tuning_cores=threads, seed=seed)
    wall = time.monotonic() - t0
    records = db.get_all_tuning_records()

    def secs(r: Any) -> float:
        vals = [float(x) for x in (r.run_secs or [])]
        return sum(vals) / len(vals) if vals else float("inf")

    valid = [r for r in records if secs(r) < INVALID_S]
    best = min(valid, key=secs) if valid else None
    errors = _ms_errors(ms_dir) if best is None else []
    return {"tuner": "metaschedule", "space": "post-order-apply (default rules)", "wall_s": wall,
            "trials": trials, "trials_done": len(records), "valid": len(valid),
            "counts": {"ok": len(valid), "failed": len(records) - len(valid)},
            "stop_reason": "budget reached" if len(records) >= trials else "search ended",
            "best_s_tuning": secs(best) if best is not None else None,
            "best_trace": tv.trace_to_json(best.trace) if best is not None else None,
            "db": str(ms_dir), "first_errors": errors, "curve": best_so_far(stamped.batches)}


def _ms_errors(ms_dir: Path, n: int = 3) -> list[str]:
    """Distinct exception lines of failed trials in MetaSchedule's task logs (why nothing was
    valid), e.g. "tvm.error.InternalError: LLVM module verification failed ... | Call parameter
    type does not match function signature!"."""
    found: list[str] = []
    exc_line = re.compile(r"^[\w.]*(Error|Exception)\b.*: ")
    for path in sorted((ms_dir / "logs").glob("*task_*.log")):
        lines = path.read_text(errors="replace").splitlines()
        in_trial = False
        for i, line in enumerate(lines):
            if re.match(r"^\d{4}-\d\d-\d\d ", line):
                in_trial = "Error in" in line and "Trial #" in line
                continue
            if in_trial and exc_line.match(line):
                text = " | ".join(x.strip() for x in lines[i:i + 2])[:300]
                if text not in found:
                    found.append(text)
                in_trial = False
    return found[:n]


def save_summary(work_dir: Path, name: str, summary: dict[str, Any]) -> None:
    (work_dir / f"{name}.tuning.json").write_text(json.dumps(summary, indent=1))


def load_summary(work_dir: Path, name: str, *, trials: int, target: dict[str, Any]
                 ) -> dict[str, Any] | None:
    """A saved summary of a successful run with the same budget and target, else None."""
    path = work_dir / f"{name}.tuning.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("error") or data.get("trials") != trials or data.get("target") != target:
        return None
    return data
