"""`python -m bench --suite public --trials 64 [--only P1,P7] [--out bench/results] ...`, and
`python -m bench report --out DIR` (bench/plots.py), `python -m bench tasks [--scale full]` (each
zoo model's tasks and the space each gets: bench/zoo_tasks.py).

Only the standard library is imported before the thread variables are set: TVM, OpenBLAS and
OpenMP read them once, when they load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=(
        "Tune every workload of a suite with tunefarm and with plain MetaSchedule (ms.tune_tir) "
        "at the same trial budget, then time both best kernels, PyTorch and numpy in one "
        "process, interleaved, checking every output. Writes results.json and results.md."))
    p.add_argument("--suite", default="public",
                   help="public, tiny, fused, lowp (bf16 GEMMs beside fp32 ones), models (whole "
                        "models: bench/model_suite.py), zoo (real architectures: bench/zoo.py), "
                        "or a JSON file with a list of {id, title, spec, peak}")
    p.add_argument("--scale", default="full", choices=["full", "small"],
                   help="--suite models and zoo: the models' size (small: minutes instead of "
                        "hours)")
    p.add_argument("--transfer", action="store_true",
                   help="the cost model's transfer benchmark (bench/transfer.py): leave-one-out "
                        "over --suite (default here: public,fused)")
    p.add_argument("--cost-model-scale", action="store_true",
                   help="what the farm's cost model costs a job at --records synthetic records "
                        "in PostgreSQL (bench/costmodel_scale.py)")
    p.add_argument("--records", default="10000,100000,1000000",
                   help="--cost-model-scale: database sizes")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="--cost-model-scale: a PostgreSQL server (its own database is created)")
    p.add_argument("--objective", default="auto",
                   help="--transfer: the farm model's objective for the warm runs (regression, "
                        "pairwise, ndcg; auto: the one that ranks held-out workloads best)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="--suite models and zoo: bfloat16 tunes and builds with tunefarm's "
                        "--dtype bfloat16 (MetaSchedule the same relax module) and runs PyTorch "
                        "with bf16 weights and inputs and under autocast; outputs checked "
                        "against float32 PyTorch within bf16's tolerance")
    p.add_argument("--fast-math", action="store_true",
                   help="--suite models: GELU's erf/tanh as vectorizable approximations")
    p.add_argument("--trials", type=int, default=64, help="trial budget of each tuner (64)")
    p.add_argument("--only", help="comma-separated workload ids, e.g. P1,P7")
    p.add_argument("--out", default=str(REPO / "bench" / "results"),
                   help="output directory (results.json, results.md, one folder per workload)")
    p.add_argument("--rounds", type=int, default=5, help="timing rounds; the median is kept (5)")
    p.add_argument("--min-ms", type=float, default=100.0,
                   help="each timing repeats the call for at least this long (100)")
    p.add_argument("--placements", type=int, default=0,
                   help="time the picks saved in --out by an earlier run (same --trials and "
                        "target) over this many random placements of their arguments "
                        "(bench/placements.py) instead of tuning")
    p.add_argument("--skip-ms", action="store_true", help="do not tune with plain MetaSchedule")
    p.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    p.add_argument("--reuse-tuning", action="store_true",
                   help="reuse the tuning results saved in --out by an earlier run with the same "
                        "--trials and target (time again without tuning again)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads for TVM (tuning and timing), PyTorch and numpy (2)")
    p.add_argument("--target", default="host",
                   help='"host" (this CPU, num-cores = --threads) or a JSON target dict')
    p.add_argument("--space", default="default", help="tunefarm's search space (default)")
    p.add_argument("--seed", type=int, default=0,
                   help="the tuners' seed; --suite models and zoo: also torch's, which makes "
                        "the models' random weights (0)")
    p.add_argument("--seeds", help="--suite models and zoo: comma-separated tuner seeds, e.g. "
                                   "0,1,2: each tunes both tuners once on the same model, all "
                                   "builds timed in one run; a tuner's figure is the median "
                                   "over its seeds (bench/seeds.py)")
    p.add_argument("--peak-fp32", type=float, default=529.0, help="fp32 peak GFLOPS (529)")
    p.add_argument("--peak-int8", type=float, default=2100.0, help="int8 peak GOPS (2100)")
    p.add_argument("--peak-bf16", type=float, default=1058.0,
                   help="bf16 peak GFLOPS (1058: twice the fp32 default, AVX512-BF16's rate; "
                        "bench/peak.c built with -mavx512bf16 measures it)")
    args = p.parse_args(argv)
    if args.trials < 1 or args.rounds < 1 or args.min_ms <= 0 or args.threads < 1:
        p.error("--trials, --rounds, --threads must be >= 1 and --min-ms > 0")
    if args.placements < 0:
        p.error("--placements must be >= 1 (0: tune and time as usual)")
    return args


def set_thread_env(threads: int) -> None:
    loaded = [m for m in ("tvm", "numpy", "torch") if m in sys.modules]
    if loaded:
        print(f"warning: {', '.join(loaded)} already imported; thread settings may not apply",
              file=sys.stderr)
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    # TVM's thread pool pins the calling (main) thread to core 0 on its first parallel call; the
    # OpenMP threads PyTorch creates afterwards inherit that mask and all run on ONE core (seen:
    # torch matmul 13-35 ms instead of ~10 ms in the interleaved timing). Three libraries share
    # this process, so no one pins.
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    # MetaSchedule's popen workers unpickle bench.msbuild.fast_build: make `bench` importable
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


def main(argv: list[str] | None = None) -> int:
    rest = sys.argv[1:] if argv is None else argv
    if rest[:1] == ["report"]:  # python -m bench report --out DIR: bench/plots.py
        from .plots import main as report

        return report(rest[1:])
    if rest[:1] == ["tasks"]:  # python -m bench tasks [--scale full]: bench/zoo_tasks.py
        from .zoo_tasks import main as tasks

        return tasks(rest[1:])
    args = parse_args(argv)
    set_thread_env(args.threads)
    if args.cost_model_scale:
        from .costmodel_scale import run_scale

        return run_scale(args)
    if args.transfer:
        from .transfer import run_transfer

        if args.suite == "public" and "--suite" not in (argv or sys.argv):
            args.suite = "public,fused"
        return run_transfer(args)
    if args.placements:
        from .placements import run_placements

        return run_placements(args)
    if args.suite in ("models", "zoo"):
        from .model_suite import run_models

        return run_models(args)
    from .run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
