"""Whole models: `python -m bench --suite models [--only bert,llama] [--scale small] [--trials 32]`,
and the same for the model zoo of real architectures (bench/zoo.py): `--suite zoo`.

Each model is defined here in torch with random weights (no downloads) and taken through
`torch.export` -> relax, partitioned by tunefarm's pipeline (`tuner.model.pipeline`). Then, in
one process:
- tunefarm: `ModelTuner` (the engine of `tunefarm tune-model`) with `--trials` per task times the
  number of tasks as its budget and `--trials` as every task's cap (as MetaSchedule's), on a
  fresh SQLite database, then `tuner.model.pipeline.build`;
- MetaSchedule: `ms.relax_integration.tune_relax` on the same partitioned module with the same
  total budget, `max_trials_per_task` = `--trials` and 32 trials per iteration, then built by
  the same passes as tunefarm's library (`_tune_metaschedule`: its weights packed at compile
  time, as TVM's `static_shape_tuning` pipeline builds it);
- TVM untuned: the partitioned module compiled as is;
- PyTorch under `inference_mode`: eager, and `torch.compile` default and max-autotune, each with
  inductor's freezing, channels-last too for convolution models (`bench.torchref`).
All are timed interleaved (`bench.timing`), every output checked against PyTorch eager.
`--seeds 0,1,2` tunes both tuners once per seed (the weights stay `--seed`'s), all of the
builds in the one timing (`bench/seeds.py`).
`--fast-math` partitions with GELU's erf/tanh approximated (`tuner.model.fastmath`; every
TVM variant then uses it). `--scale small` shrinks each model (hidden sizes, sequence,
channels) to make a run take minutes instead of hours; RESULTS.md says which scale a figure is
from. The databases stay in `--out` (`work-MODEL-SCALE/`): `--reuse-tuning` builds every
variant from them again and times it without tuning again.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from . import seeds as seeds_mod
from .report import models_table
from .torchref import checked_reference, torch_variants

# (rtol, atol) of a bf16 run's outputs against float32 PyTorch: bf16 operands carry 8 bits of
# mantissa (2^-8 = 4e-3 relative each); a layer's output sums hundreds of such products and
# goes through a normalisation. Every variant's max error is recorded beside its check.
BF16_TOLERANCE = (5e-2, 5e-2)

SCALES = {
    "full": {"bert": dict(seq=128, hidden=768, heads=12, ffn=3072),
             "llama": dict(hidden=2048, heads=16, ffn=5632, cache=128),
             "resnet": dict(size=224, width=64),
             "mobilenet": dict(size=224, width=32)},
    "small": {"bert": dict(seq=64, hidden=256, heads=4, ffn=1024),
              "llama": dict(hidden=512, heads=8, ffn=1408, cache=64),
              "resnet": dict(size=64, width=16),
              "mobilenet": dict(size=64, width=16)},
}


def _models(torch: Any) -> dict[str, Any]:
    nn, F = torch.nn, torch.nn.functional

    class Bert(nn.Module):
        """A BERT encoder layer: self-attention with a mask, residual + layer norm, GELU FFN."""

        def __init__(self, seq: int, hidden: int, heads: int, ffn: int) -> None:
            super().__init__()
            self.heads, self.seq, self.hidden = heads, seq, hidden
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def forward(self, x: Any, mask: Any) -> Any:
            b, s, h = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, h // self.heads).permute(
                2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(h // self.heads) + mask, -1)
            ctx = (att @ v).permute(0, 2, 1, 3).reshape(b, s, h)
            x = self.ln1(x + self.out(ctx))
            return self.ln2(x + self.down(F.gelu(self.up(x))))

        def inputs(self) -> tuple[Any, ...]:
            return (torch.randn(1, self.seq, self.hidden), torch.zeros(1, 1, 1, self.seq))

    class Llama(nn.Module):
        """A Llama-style decoder layer at batch 1, one new token against a KV cache: RMSNorm,
        attention over cache + token, SwiGLU MLP (GEMV-heavy)."""

        def __init__(self, hidden: int, heads: int, ffn: int, cache: int) -> None:
            super().__init__()
            self.heads, self.hidden, self.cache = heads, hidden, cache
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False)
                                              for _ in range(4))
            self.gate, self.up = (nn.Linear(hidden, ffn, bias=False) for _ in range(2))
            self.down = nn.Linear(ffn, hidden, bias=False)
            self.n1, self.n2 = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.ones(hidden))

        def _rms(self, x: Any, w: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        def forward(self, x: Any, k_cache: Any, v_cache: Any) -> Any:
            d = self.hidden // self.heads
            h = self._rms(x, self.n1)
            q = self.q(h).reshape(1, 1, self.heads, d).transpose(1, 2)
            k = torch.cat([k_cache, self.k(h).reshape(1, 1, self.heads, d).transpose(1, 2)], 2)
            v = torch.cat([v_cache, self.v(h).reshape(1, 1, self.heads, d).transpose(1, 2)], 2)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1)
            x = x + self.o((att @ v).transpose(1, 2).reshape(1, 1, self.hidden))
            h = self._rms(x, self.n2)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

        def inputs(self) -> tuple[Any, ...]:
            d = self.hidden // self.heads
            return (torch.randn(1, 1, self.hidden),
                    torch.randn(1, self.heads, self.cache, d),
                    torch.randn(1, self.heads, self.cache, d))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Any) -> Any:
            return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))

    class ResNet18(nn.Module):
        def __init__(self, size: int, width: int) -> None:
            super().__init__()
            self.size = size
            w = width
            self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], w
            for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
                layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x: Any) -> Any:
            return self.fc(self.layers(self.stem(x)).mean((2, 3)))

        def inputs(self) -> tuple[Any, ...]:
            return (torch.randn(1, 3, self.size, self.size),)

    class Inverted(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            mid = cin * expand
            self.res = stride == 1 and cin == cout
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
                nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU6(), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.res else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self, size: int, width: int) -> None:
            super().__init__()
            self.size = size
            w = width
            cfg = [(1, w // 2, 1, 1), (6, w * 3 // 4, 2, 2), (6, w, 3, 2), (6, 2 * w, 4, 2),
                   (6, 3 * w, 3, 1), (6, 5 * w, 3, 2), (6, 10 * w, 1, 1)]
            layers: list[Any] = [nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w),
                                 nn.ReLU6()]
            cin = w
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(Inverted(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers += [nn.Conv2d(cin, 40 * w, 1, bias=False), nn.BatchNorm2d(40 * w), nn.ReLU6()]
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(40 * w, 1000)

        def forward(self, x: Any) -> Any:
            return self.fc(self.features(x).mean((2, 3)))

        def inputs(self) -> tuple[Any, ...]:
            return (torch.randn(1, 3, self.size, self.size),)

    return {"bert": Bert, "llama": Llama, "resnet": ResNet18, "mobilenet": MobileNetV2}


def _calibrate_batch_norm(net: Any, inputs: tuple[Any, ...], torch: Any) -> None:
    """Batch norm's running statistics taken from the example input, then eval mode. With fresh
    ones (mean 0, variance 1) random weights shrink a deep net's activations layer by layer:
    MobileNetV2's last convolution saw values below 1e-7 and its output was its classifier's
    bias to within 1e-8, so comparing outputs checked nothing."""
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: one batch gives exactly its statistics
    if norms:
        net.train()
        with torch.no_grad():
            net(*inputs)
    net.eval()


def _tune_tunefarm(mod: Any, tasks: list[Any], target: dict[str, Any], trials: int,
                   work: Path, log: Any, passes: dict[str, Any],
                   earlier: dict[str, Any] | None = None, *, seed: int = 0
                   ) -> tuple[Any, dict[str, Any]]:
    """Tune (unless `earlier`: the info of the run whose database is in `work`) and build."""
    from tuner.db import Store
    from tuner.interop.ms_database import TunefarmDatabase
    from tuner.measure import MeasureOptions
    from tuner.measure.local import LocalMeasurer
    from tuner.model.job import ModelProgress, ModelRequest, ModelTuner
    from tuner.model.pipeline import build

    store = Store(f"sqlite:///{work / 'tunefarm.db'}")

    info: dict[str, Any] = {}
    curve: list[list[Any]] = []  # [trials, wall_s, estimate_s]: bench/curves.py
    t0 = time.monotonic()

    def progress(p: ModelProgress) -> None:
        est = f"{p.estimate_s * 1e3:.3f} ms" if p.estimate_s else "-"
        log(f"    tunefarm [{p.trials}/{p.total}] estimate {est}  {p.message}")
        if not curve or curve[-1][0] != p.trials:
            curve.append([p.trials, time.monotonic() - t0, p.estimate_s])

    if earlier is None:
        with LocalMeasurer() as measurer:
            summary = ModelTuner(store, measurer, on_progress=progress).run(ModelRequest(
                tasks=tasks, target=target, trials=trials * len(tasks),
                max_trials_per_task=trials,  # MetaSchedule's cap too: equal budgets
                seed=seed,
                options=MeasureOptions.from_settings(_settings(), target)))
        info = {"tuning_s": time.monotonic() - t0, "trials": summary.trials,
                "estimate_s": summary.estimate_s, "curve": curve}
    built = build(mod, target, TunefarmDatabase(store, ranking="median"), **passes)
    return built.executable, {**(earlier or info), "untuned": built.untuned}


def _settings() -> Any:
    from tuner.core.config import get_settings

    return get_settings()


def _tune_metaschedule(mod: Any, part: Any, n_tasks: int, target: Any, trials: int, work: Path,
                       passes: dict[str, Any], earlier: dict[str, Any] | None = None, *,
                       threads: int = 2, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """MetaSchedule as TVM's `static_shape_tuning` pipeline runs it: `tune_relax` on the same
    partitioned module (constant weights bound and layout-free), 32 trials per iteration, then
    built by the same passes as tunefarm's library (`tuner.model.pipeline.build`:
    MetaScheduleApplyDatabase, SplitLayoutRewritePreproc, FoldConstant), so its kernels take
    weights packed once at compile time, never on each call."""
    from tuner.core.tvm_api import load_tensor_intrins, ms
    from tuner.model.pipeline import build

    from .curves import best_so_far, callbacks, stamps
    from .tune import MS_TRIALS_PER_ITER, ms_builder_runner

    if earlier is None:
        load_tensor_intrins("x86")  # the default CPU rules name its VNNI and AVX-512 dots
        builder, runner = ms_builder_runner(threads)
        stamped = stamps()
        t0 = time.monotonic()
        db = ms.relax_integration.tune_relax(
            mod=part, params={}, target=target, work_dir=str(work / "ms"),
            max_trials_global=trials * n_tasks, max_trials_per_task=trials,
            num_trials_per_iter=MS_TRIALS_PER_ITER, builder=builder, runner=runner,
            measure_callbacks=callbacks(stamped), seed=seed)
        earlier = {"tuning_s": time.monotonic() - t0, "trials": len(db),
                   "curve": best_so_far(stamped.batches, stamped.n_tasks or n_tasks)}
    else:
        db = ms.database.JSONDatabase(work_dir=str(work / "ms"), allow_missing=False)
    return build(mod, target, db, **passes).executable, earlier


def run_models(args: Any) -> int:
    import torch

    from tuner.core.tvm_api import host_target_dict, make_target, relax_from_exported_program
    from tuner.core.tvm_api import tvm as tvm_mod
    from tuner.model.pipeline import extract, partition

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    zoo = args.suite == "zoo"
    if zoo:
        from .zoo import ZOO
    names = (args.only.split(",") if args.only
             else list(ZOO) if zoo else list(SCALES[args.scale]))
    target = host_target_dict(args.threads) if args.target == "host" else json.loads(args.target)
    tgt = make_target(target)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from .report import machine_info

    (out_dir / "machine.json").write_text(json.dumps(
        machine_info(target, args.threads, torch), indent=2, default=str))
    seeds = seeds_mod.parse(args.seeds) if args.seeds else [args.seed]

    def work_dir(name: str, seed: int) -> Path:
        return (out_dir / f"work-{name}-{args.scale}{_suffix(args)}"
                f"{seeds_mod.work_suffix(seed, seeds)}")

    results: dict[str, Any] = {}
    saved = out_dir / "models.json"
    previous = json.loads(saved.read_text()) if args.reuse_tuning and saved.exists() else {}
    if args.reuse_tuning:
        missing = [n for n in names if n not in previous
                   or not all(work_dir(n, seed).is_dir() for seed in seeds)]
        if missing:
            raise SystemExit(f"--reuse-tuning: no earlier run of {', '.join(missing)} "
                             f"in {out_dir}")
        results = {n: r for n, r in previous.items() if n not in names}
    for name in names:
        if zoo:  # bench/zoo.py: made in eval mode, batch norm calibrated
            net, inputs = ZOO[name].make(args.scale)
        else:
            net = _models(torch)[name](**SCALES[args.scale][name])
            inputs = net.inputs()
            _calibrate_batch_norm(net, inputs, torch)
        with torch.inference_mode():
            reference = checked_reference(name, [net(*inputs).numpy()])
        with torch.no_grad():
            program = torch.export.export(net, inputs)
        mod = relax_from_exported_program(program)
        passes = {"fast_math": args.fast_math, "dtype": args.dtype}  # tunefarm's and MS's
        part = partition(mod, tgt, **passes)
        tasks = extract(part, tgt)
        print(f"== {name} ({args.scale}): {len(tasks)} tasks, "
              f"{sum(t.weight for t in tasks)} calls", flush=True)
        exes: dict[str, Any] = {}
        tuning: dict[str, Any] = {}
        for seed in seeds:
            exes_s, info_s = _tune_both(name, mod, part, tasks, target, tgt, work_dir(name, seed),
                                        passes, args, seed, seeds, previous.get(name))
            exes.update(exes_s)
            tuning.update(info_s)
        exes["tvm-untuned"] = tvm_mod.compile(part, target=tgt)
        timed = _time(exes, net, inputs, reference, args, torch)
        results[name] = {"scale": args.scale, **passes, "tasks": len(tasks),
                         "trials_per_task": args.trials, "tuning": tuning, "timing": timed}
        if len(seeds) > 1:
            results[name]["seeds"] = {t: seeds_mod.aggregate(timed, t) for t in seeds_mod.TUNERS}
        (out_dir / "models.json").write_text(json.dumps(results, indent=2, default=str))
        row = {k: v.get("median_s") for k, v in timed.items()}
        print(f"    {name}: " + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in row.items() if v),
              flush=True)
    text = models_table(results)
    (out_dir / "models.md").write_text(text)
    print(text)
    return 0


def _tune_both(name: str, mod: Any, part: Any, tasks: list[Any], target: dict[str, Any],
               tgt: Any, work: Path, passes: dict[str, Any], args: Any, seed: int,
               seeds: list[int], previous: dict[str, Any] | None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One seed of both tuners (or, with `previous`, their databases in `work` built again):
    ({variant name: executable}, {variant name: tuning info})."""
    tf_name, ms_name = (seeds_mod.label(t, seed, seeds) for t in seeds_mod.TUNERS)
    earlier = seeds_mod.tuned(previous) if previous is not None else None
    if earlier is None:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    elif tf_name not in earlier:
        raise SystemExit(f"--reuse-tuning: the earlier run of {name} has no {tf_name}")
    tf_exe, tf_info = _tune_tunefarm(mod, tasks, target, args.trials, work,
                                     lambda m: print(m, flush=True), passes,
                                     earlier and earlier[tf_name], seed=seed)
    print(f"    {tf_name} tuned in {tf_info['tuning_s']:.0f} s", flush=True)
    exes, infos = {tf_name: tf_exe}, {tf_name: tf_info}
    ms_prev = earlier.get(ms_name, {}) if earlier is not None else None
    if not args.skip_ms and ms_prev != {}:  # reused: only if the earlier run tuned it
        exes[ms_name], infos[ms_name] = _tune_metaschedule(
            mod, part, len(tasks), tgt, args.trials, work, passes, ms_prev,
            threads=args.threads, seed=seed)
        print(f"    {ms_name} tuned in {infos[ms_name]['tuning_s']:.0f} s", flush=True)
    return exes, infos


def _time(exes: dict[str, Any], net: Any, inputs: tuple[Any, ...], reference: list[Any],
          args: Any, torch: Any) -> dict[str, Any]:
    """The compiled models, PyTorch eager and torch.compile timed interleaved."""
    from bench.timing import Variant, time_interleaved
    from tuner.core.tvm_api import relax, tvm

    tvm_in = [tvm.runtime.tensor(t.numpy()) for t in inputs]
    variants = []
    for label, exe in exes.items():
        if exe is not None:
            vm = relax.VirtualMachine(exe, tvm.cpu())
            # from_exported_program returns a tuple: the model has one output
            variants.append(Variant(label, fn=lambda vm=vm: vm["main"](*tvm_in)[0]))
    with torch.inference_mode():
        variants += torch_variants(net, inputs, torch, compiled=not args.no_torch,
                                   dtype=args.dtype)
        tol = BF16_TOLERANCE if args.dtype == "bfloat16" else (1e-3, 1e-3)
        return time_interleaved(variants, reference, *tol, rounds=args.rounds,
                                min_ms=args.min_ms)


def _suffix(args: Any) -> str:
    """Of a work folder: a bf16 run's databases are not a float32 run's."""
    return "-bf16" if args.dtype == "bfloat16" else ""
