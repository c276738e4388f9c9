"""The whole-model baselines as their experts run them (bench/model_suite.py): MetaSchedule's
library
built by the same passes as tunefarm's, PyTorch's compiled variants with freezing and
max-autotune, and an output check that compares real outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import model_suite as models
from bench import torchref
from bench.timing import check

PASSES = {"fast_math": False, "dtype": "float32"}  # the model pipeline's options, both tuners


def test_metaschedules_library_is_built_by_tunefarms_passes(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Both libraries go through `tuner.model.pipeline.build` (MetaScheduleApplyDatabase, the
    layout rewrite split out and folded), each with its own tuner's database."""
    from tuner.model import pipeline

    seen: list[tuple[Any, Any]] = []

    def spy(mod: Any, target: Any, database: Any, **passes: Any) -> Any:
        assert passes == PASSES
        seen.append((mod, database))
        return pipeline.Built(executable="exe", tasks=[], untuned=[])

    monkeypatch.setattr(pipeline, "build", spy)
    work = tmp_path / "work"
    (work / "ms").mkdir(parents=True)
    for name in ("database_workload.json", "database_tuning_record.json"):
        (work / "ms" / name).write_text("")
    exe, info = models._tune_metaschedule("MOD", "PART", 3, "llvm", 16, work, PASSES,
                                          earlier={"tuning_s": 1.0, "trials": 48})
    assert exe == "exe" and info["trials"] == 48
    (mod, db), = seen
    assert mod == "MOD" and type(db).__name__ == "JSONDatabase"
    from bench import tune

    assert tune.MS_TRIALS_PER_ITER == 32  # both suites: MetaSchedule's documented batch size


class _FakeCompiled:
    def __init__(self, net: Any, mode: str | None, calls: list[tuple[str | None, bool]],
                 config: Any) -> None:
        self.net, self.mode, self.calls, self.config = net, mode, calls, config

    def __call__(self, *args: Any) -> Any:
        self.calls.append((self.mode, bool(self.config.freezing)))
        return self.net(*args)


def test_pytorch_runs_eager_and_compiled_with_freezing_and_max_autotune(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    calls: list[tuple[str | None, bool]] = []
    config = torch._inductor.config
    monkeypatch.setattr(torch, "compile", lambda net, mode=None: _FakeCompiled(
        net, mode, calls, config))
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    with torch.inference_mode():
        variants = torchref.torch_variants(net, inputs, torch)
        outs = [v.fn() for v in variants]
    names = [v.name for v in variants]
    assert names == ["pytorch", "torch.compile default+freezing",
                     "torch.compile default+freezing, channels-last",
                     "torch.compile max-autotune+freezing",
                     "torch.compile max-autotune+freezing, channels-last"]
    # each compiled variant ran its first (compiling) call under freezing, before any timing
    assert calls[:4] == [(None, True), (None, True), ("max-autotune", True),
                         ("max-autotune", True)]
    for out in outs:
        np.testing.assert_allclose(out.numpy(), outs[0].numpy(), rtol=1e-6, atol=1e-6)
    linear = torchref.torch_variants(torch.nn.Linear(4, 4), (torch.randn(2, 4),), torch)
    assert not any("channels-last" in v.name for v in linear)  # no convolution: no layout


def test_pytorch_in_bf16_runs_bf16_weights_and_autocast() -> None:
    """`--dtype bfloat16`: the model converted to bf16 (its output bf16, widened exactly for the
    check) and the float32 model under CPU autocast, both within bf16's tolerance of float32."""
    torch = pytest.importorskip("torch")
    from bench.timing import Variant, time_interleaved

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).eval()
    x = torch.randn(8, 64)
    with torch.inference_mode():
        ref = [net(x).numpy()]
        variants = torchref.torch_variants(net, (x,), torch, compiled=False, dtype="bfloat16")
        assert [v.name for v in variants] == ["pytorch", "pytorch autocast"]
        assert variants[0].fn().dtype == torch.bfloat16
        assert next(net.parameters()).dtype == torch.float32  # the caller's model untouched
        timed = time_interleaved([*variants, Variant("float32", fn=lambda: net(x))], ref,
                                 *models.BF16_TOLERANCE, rounds=1, min_ms=1.0, pause_s=0.0,
                                 log=lambda _m: None)
    assert all(t["correct"] for t in timed.values()), timed
    assert timed["pytorch"]["max_abs_err"] > 1e-4 > timed["float32"]["max_abs_err"]


def test_the_output_check_fails_on_a_perturbed_output() -> None:
    ref = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    assert check([ref.copy()], [ref], 1e-3, 1e-3)["ok"]
    bad = ref.copy()
    bad[2, 5] += 0.05
    result = check([bad], [ref], 1e-3, 1e-3)
    assert not result["ok"] and "1 of 64 elements differ" in result["error"]


def test_a_reference_of_zeros_is_refused() -> None:
    """A net whose output is ~0 (random weights, uncalibrated batch norm) would pass any check."""
    with pytest.raises(SystemExit, match="compares nothing"):
        torchref.checked_reference("mobilenet", [np.full((1, 1000), 1e-31, "float32")])
    ref = [np.ones((2, 2), "float32")]
    assert torchref.checked_reference("ok", ref) is ref


def test_metaschedule_tunes_a_model_with_the_op_suites_builder_and_runner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_relax gets the builder of bench.msbuild (no 30 s start-up timeout that lost every
    one-candidate task), tunefarm's build timeout and timing protocol, and the seed."""
    from bench.msbuild import fast_build
    from tuner.core.config import get_settings
    from tuner.core.tvm_api import ms
    from tuner.model import pipeline

    got: dict[str, Any] = {}

    def tune_relax(**kw: Any) -> list[Any]:
        got.update(kw)
        return []

    monkeypatch.setattr(ms.relax_integration, "tune_relax", tune_relax)
    monkeypatch.setattr(pipeline, "build", lambda *a, **k: pipeline.Built(
        executable="exe", tasks=[], untuned=[]))
    models._tune_metaschedule("MOD", "PART", 3, "llvm", 16, tmp_path, PASSES, threads=2,
                              seed=7)
    s = get_settings()
    builder, runner = got["builder"]._inst, got["runner"]._inst  # TVM's derived objects
    assert builder.f_build is fast_build and builder.timeout_sec == s.build_timeout_s
    assert runner.timeout_sec == s.run_timeout_s
    assert runner.evaluator_config.repeat == s.repeats
    assert (got["max_trials_global"], got["max_trials_per_task"], got["seed"]) == (48, 16, 7)
    assert got["num_trials_per_iter"] == 32
