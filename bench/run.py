"""The benchmark driver: per workload tune (tunefarm, MetaSchedule), then time all variants."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from . import report
from .suites import load_suite, select


def log(msg: str) -> None:
    print(msg, flush=True)


def _import_torch(args: argparse.Namespace) -> Any:
    if args.no_torch:
        return None
    try:
        import torch
    except ImportError:
        log("PyTorch is not installed: its column shows '–' (pip install 'torch==2.13.0')")
        return None
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    return torch


def _block_torch_in_children(out: Path) -> None:
    """Tuning children (tunefarm's sandbox, MetaSchedule's builder and runner workers) never use
    torch, but `import tvm` loads it when importable (~1.8 s per process, TVM_NOTES §10)."""
    stub = out / ".no-torch" / "torch"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(
        "raise ImportError('torch is blocked in the benchmark tuning processes')\n")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(stub.parent), os.environ["PYTHONPATH"]])


def _target(args: argparse.Namespace) -> dict[str, Any]:
    from tuner.core import tvm_api as tv

    spec = tv.host_target_dict(args.threads) if args.target == "host" else args.target
    return tv.target_to_dict(tv.make_target(spec))


def _tune(entry: dict[str, Any], wl: Any, target: dict[str, Any], wdir: Path,
          args: argparse.Namespace) -> dict[str, Any]:
    from .tune import load_summary, resolve_space, save_summary, tune_metaschedule, tune_tunefarm

    out: dict[str, Any] = {}
    for name in ("tunefarm", "metaschedule"):
        if name == "metaschedule" and args.skip_ms:
            out[name] = None
            continue
        summ = load_summary(wdir, name, trials=args.trials, target=target) \
            if args.reuse_tuning else None
        if summ is not None:
            log(f"  {name}: reusing {wdir / (name + '.tuning.json')}")
        else:
            log(f"  {name}: tuning {args.trials} trials")
            try:
                if name == "tunefarm":
                    summ = tune_tunefarm(wl, target, args.trials, wdir, threads=args.threads,
                                         space=args.space, seed=args.seed, log=log)
                else:
                    summ = tune_metaschedule(wl, target, args.trials, wdir, threads=args.threads,
                                             seed=args.seed, log=log)
            except Exception as exc:  # one failed tuner must not stop the suite
                traceback.print_exc()
                summ = {"tuner": name, "error": f"{type(exc).__name__}: {exc}"[:2000],
                        "wall_s": None, "best_trace": None, "trials": args.trials}
                if name == "tunefarm":
                    try:
                        summ["space"] = resolve_space(wl, target, args.space)
                    except Exception as exc2:
                        summ["space"] = f"? ({type(exc2).__name__})"
            summ["target"] = target
            save_summary(wdir, name, summ)
        best = summ.get("best_s_tuning")
        log(f"  {name}: {summ.get('valid')} valid of {summ.get('trials_done')}, "
            f"{summ.get('wall_s') or 0:.1f} s, best while tuning "
            + (f"{best * 1e3:.4g} ms" if best else "-")
            + (f"  ERROR {summ['error']}" if summ.get("error") else ""))
        out[name] = summ
    return out


def _kernel_variant(name: str, summ: dict[str, Any] | None, wl: Any, inputs: list[Any],
                    target: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(Variant or None, status/extra fields) for a tuner's best schedule."""
    from tuner.core import tvm_api as tv

    from .kernels import cross_check_stripped, prepare, sched_mod_from_trace
    from .timing import Variant

    if summ is None:
        return None, {"status": "unavailable", "reason": "--skip-ms"}
    if summ.get("error"):
        return None, {"status": "error", "reason": f"tuning failed: {summ['error']}"}
    if not summ.get("best_trace"):
        why = f"0 valid of {summ.get('trials_done')} candidates"
        if summ.get("first_errors"):
            why += "; e.g. " + " | ".join(summ["first_errors"])
        return None, {"status": "no valid kernel", "reason": why}
    try:
        smod = sched_mod_from_trace(wl, summ["best_trace"])
        kernel = prepare(smod, wl, inputs, tv.make_target(target))
        extra = {"packed": kernel.packed, "prepack_s": kernel.prepack_s,
                 "packing_timed": kernel.packing_timed,
                 "same_params_as_tuned_kernel": cross_check_stripped(smod, kernel)}
        if not extra["same_params_as_tuned_kernel"]:
            log(f"    !!! {name}: the timed kernel's parameters differ from the kernel the tuner "
                "measured (tuner.core.prepack.kernel); timing it anyway")
    except Exception as exc:
        traceback.print_exc()
        return None, {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
    note = ("best record replayed; weight packing run once, not timed" if kernel.packed else
            f"best record replayed; the packing of runtime input(s) "
            f"{', '.join(kernel.packing_timed)} timed in every call" if kernel.packing_timed
            else "best record replayed")
    return Variant(name, kernel=kernel, note=note), extra


def _peaks(args: argparse.Namespace) -> dict[str, float]:
    return {"fp32": args.peak_fp32, "int8": args.peak_int8, "bf16": args.peak_bf16}


def bench_one(entry: dict[str, Any], target: dict[str, Any], out: Path, torch: Any,
              args: argparse.Namespace) -> dict[str, Any]:
    from tuner.workloads import parse_spec

    from .baselines import numpy_impl, torch_impl, torch_tolerance
    from .timing import Variant, time_interleaved

    wl = parse_spec(entry["spec"])
    peak = _peaks(args).get(entry["peak"] or "")
    row: dict[str, Any] = {
        "id": entry["id"], "title": entry["title"] or wl.description, "op": wl.op,
        "spec": wl.spec, "key": wl.key, "description": wl.description, "flops": wl.flops,
        "peak": entry["peak"], "peak_gops": peak, "tuning": {}, "variants": {}, "ratios": {}}
    wdir = out / entry["id"]
    wdir.mkdir(parents=True, exist_ok=True)
    tuning = _tune(entry, wl, target, wdir, args)
    row["tuning"] = {k: v and {kk: vv for kk, vv in v.items() if kk != "best_trace"}
                     for k, v in tuning.items()}
    inputs = wl.make_inputs(0)
    reference = wl.reference(inputs)
    rtol, atol = wl.tolerance()
    variants, extra, status = [], {}, {}
    for name in ("tunefarm", "metaschedule"):
        v, info = _kernel_variant(name, tuning[name], wl, inputs, target)
        if v is not None:
            variants.append(v)
            extra[name] = info
        else:
            status[name] = info
        if name == "tunefarm" and v is not None:
            variants.append(Variant(report.PYLOOP, kernel=v.kernel, python_loop=True,
                                    note="tunefarm's kernel called from a Python loop"))
        elif name == "tunefarm":
            status[report.PYLOOP] = info
    model = entry.get("model")
    for name, make in (("pytorch", (lambda w, x: torch_impl(w, x, torch, model)) if torch
                        else None),
                       ("numpy", numpy_impl)):
        if make is None:
            status[name] = {"status": "unavailable",
                            "reason": "PyTorch not installed or --no-torch"}
            continue
        try:
            fn, note = make(wl, inputs)
        except Exception as exc:  # e.g. a torch build without the op
            fn, note = None, f"{type(exc).__name__}: {exc}"[:500]
        if fn is None:
            status[name] = {"status": "unavailable", "reason": note}
        else:
            variants.append(Variant(name, fn=fn, note=note, tolerance=torch_tolerance(wl)
                                    if name == "pytorch" else None))
    log(f"  timing {', '.join(v.name for v in variants)}: {args.rounds} rounds, "
        f">= {args.min_ms:g} ms each")
    timed = time_interleaved(variants, reference, rtol, atol, rounds=args.rounds,
                             min_ms=args.min_ms, log=log)
    for name in report.VARIANTS:
        if name in timed:
            res = timed[name]
            med = res.get("median_s")
            res["gflops"] = wl.flops / med / 1e9 if med and wl.flops else None
            res.update(extra.get(name, {}))
            row["variants"][name] = res
        else:
            row["variants"][name] = status.get(name, {"status": "unavailable"})
    v = row["variants"]
    row["ratios"] = {"tunefarm/metaschedule": report.ratio(v["tunefarm"], v["metaschedule"]),
                     "tunefarm/pytorch": report.ratio(v["tunefarm"], v["pytorch"]),
                     "tunefarm/numpy": report.ratio(v["tunefarm"], v["numpy"]),
                     "tunefarm/pytorch, same loop": report.ratio(v[report.PYLOOP], v["pytorch"])}
    py, tf = v[report.PYLOOP], v["tunefarm"]
    row["dispatch_s"] = (py["median_s"] - tf["median_s"]
                         if report.ratio(py, tf) is not None else None)
    ok = peak and tf.get("status") == "ok" and tf.get("gflops")
    row["pct_of_peak"] = 100 * tf["gflops"] / peak if ok else None
    # the fastest round: what the kernel does undisturbed on a shared machine (bench/peak.c
    # reports its best of three too; the median carries other tenants' load on the caches)
    row["pct_of_peak_best_round"] = (100 * wl.flops / min(tf["rounds_s"]) / 1e9 / peak
                                     if ok and tf.get("rounds_s") else None)
    return row


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch = _import_torch(args)
    if importlib.util.find_spec("torch") is not None:
        _block_torch_in_children(out)
    target = _target(args)
    entries = select(load_suite(args.suite), args.only)
    doc: dict[str, Any] = {
        "machine": report.machine_info(target, args.threads, torch),
        "config": {"suite": args.suite, "only": args.only, "trials": args.trials,
                   "rounds": args.rounds, "min_ms": args.min_ms, "threads": args.threads,
                   "space": args.space, "seed": args.seed, "skip_ms": args.skip_ms,
                   "reuse_tuning": args.reuse_tuning,
                   "peak": _peaks(args)},
        "columns": report.COLUMNS, "workloads": []}
    log(f"target {json.dumps(target)}; {len(entries)} workloads; results in {out}")
    load = doc["machine"]["loadavg_start"]
    if load and load[0] > report.BUSY_LOAD:
        log(f"!!! warning: load average {load}: the machine is not idle; timings with "
            f"{args.threads} threads will be slow and noisy (PyTorch's OpenMP most)")
    t0 = time.monotonic()
    for entry in entries:
        log(f"== {entry['id']} {entry['title'] or ''} {json.dumps(entry['spec'])}")
        try:
            row = bench_one(entry, target, out, torch, args)
        except Exception as exc:  # record it, go on with the suite
            traceback.print_exc()
            row = {"id": entry["id"], "title": entry["title"], "op": entry["spec"].get("op"),
                   "spec": entry["spec"], "flops": 0, "peak": entry["peak"], "tuning": {},
                   "variants": {}, "ratios": {}, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        doc["workloads"].append(row)
        doc["machine"]["loadavg_end"] = report.loadavg()
        doc["wall_s"] = time.monotonic() - t0
        report.write(out, doc)
    md = (out / "results.md").read_text()
    log("\n" + md)
    wrong = doc["summary"]["wrong_outputs"]
    if wrong:
        log(f"!!! WRONG OUTPUTS: {', '.join(wrong)}")
    return 1 if wrong or any(w.get("error") for w in doc["workloads"]) else 0
