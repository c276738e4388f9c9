"""Whole models in bf16 (`tune-model --dtype bfloat16`, `build --dtype bfloat16`): the linear
layers on bf16 operands with float32 sums, the rest in float32; outputs against PyTorch's CPU
autocast within bf16's tolerance. PyTorch is an optional extra (CI installs it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from schedules.match import BF16, GemmMatch, match_gemm_func
from tuner.core.tvm_api import make_target, ms, relax, tvm
from tuner.model.lowp import dtype_passes
from tuner.model.pipeline import build, extract, partition

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
MLP = Path(__file__).parent / "models" / "bf16_mlp.py"
TOL = 3e-2  # bf16 operands: 8 bits of mantissa, one rounding each, sums in float32


def _reference() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the input, PyTorch's float32 output, its output under bf16 autocast)."""
    from tuner.model import load

    spec = load.importlib.util.spec_from_file_location("bf16_mlp_reference", MLP)
    assert spec is not None and spec.loader is not None
    module = load.importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net, (x,) = module.model(), module.example_inputs()
    with torch.inference_mode():
        fp32 = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = net(x).float()
    return x.numpy(), fp32.numpy(), bf16.numpy()


def _run(lib: object, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(lib, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    return (got[0] if not hasattr(got, "numpy") else got).numpy()


def test_linear_layers_become_bf16_gemms_and_the_rest_stays_float32() -> None:
    from tuner.model.load import load_model

    target = make_target("host")
    mod = load_model(MLP)
    tasks = {t.name: match_gemm_func(t.func)
             for t in extract(partition(mod, target, dtype="bfloat16"), target)}
    gemms = {n: g for n, g in tasks.items() if isinstance(g, GemmMatch)}
    bf16 = sorted(n for n, g in gemms.items() if g.dtype == BF16)
    assert len(bf16) == 2, gemms  # up and down: weights bound as constants
    assert any(g.dtype == "float32" for g in gemms.values()), gemms  # h @ h.T: two activations
    plain = [match_gemm_func(t.func) for t in extract(partition(mod, target), target)]
    assert not any(isinstance(g, GemmMatch) and g.dtype == BF16 for g in plain)
    with pytest.raises(ValueError, match="float16"):
        dtype_passes("float16")


def test_a_bf16_build_matches_autocast_within_bf16s_tolerance() -> None:
    """Untuned (relax's default loops): the numerics of the rewrite alone."""
    from tuner.model.load import load_model

    x, fp32, autocast = _reference()
    built = build(load_model(MLP), "host", ms.database.MemoryDatabase(), dtype="bfloat16")
    got = _run(built.executable, x)
    np.testing.assert_allclose(got, autocast, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(got, fp32, rtol=TOL, atol=TOL)
    assert not np.allclose(got, fp32, rtol=1e-5, atol=1e-5)  # it did compute in bf16


@pytest.mark.parametrize("command", ["tune-model", "build"])
def test_an_unknown_dtype_is_refused_before_torch_tvm_or_the_model_loads(command: str) -> None:
    """The check comes first: no second of imports and model export to learn a typo (the model
    file need not even exist)."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "tuner", command,
                          str(MLP.with_name("absent.py")), "--dtype", "float16"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2, run.stdout + run.stderr[-2000:]
    assert "--dtype 'float16': a model is tuned in one of float32, bfloat16" in run.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tuner.cli.model" in imported and not {"tvm", "torch", "tvm_ffi"} & imported


@pytest.mark.slow
def test_tune_model_and_build_in_bf16_from_the_cli(tmp_path: Path) -> None:
    db, so = f"sqlite:///{tmp_path / 'tf.db'}", tmp_path / "mlp.so"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tuner", *args, "--db", db], cwd=REPO,
                              capture_output=True, text=True, timeout=900, check=False)

    bad = cli("tune-model", str(MLP), "--dtype", "float16")
    assert bad.returncode != 0 and "--dtype 'float16'" in bad.stdout + bad.stderr
    tuned = cli("tune-model", str(MLP), "--dtype", "bfloat16", "--trials", "16",
                "--round-trials", "4")
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    built = cli("build", str(MLP), "--dtype", "bfloat16", "-o", str(so))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert re.search(r"wrote \S+: [1-9]\d* of \d+ tasks with a tuned schedule", built.stdout)
    x, fp32, autocast = _reference()
    got = _run(tvm.runtime.load_module(str(so)), x)
    np.testing.assert_allclose(got, autocast, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(got, fp32, rtol=TOL, atol=TOL)
