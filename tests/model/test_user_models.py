"""The models users bring (PyTorch is an optional extra: these tests need it, and CI installs
it): their own `nn.Module` classes with a `forward(self, input)` argument and PyTorch's
`TransformerEncoderLayer` inside, tuned and built from a `.py` file as a user types it; relax
written in TVMScript inside `model()`; several inputs and outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.core.errors import SpecError
from tuner.core.tvm_api import make_target, relax, tvm
from tuner.model.load import load_model
from tuner.model.pipeline import extract, partition

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
USER_NET = Path(__file__).parent / "models" / "user_net.py"


def _cli(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args, "--db", db], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)


def _torch_reference(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    from tuner.model import load

    spec = load.importlib.util.spec_from_file_location("user_net_reference", path)
    assert spec is not None and spec.loader is not None
    module = load.importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inputs = module.example_inputs()
    with torch.inference_mode():
        out = module.model()(*inputs)
    return [x.numpy() for x in inputs], out.numpy()


@pytest.mark.slow
def test_a_users_own_module_with_an_encoder_layer_tunes_and_builds(tmp_path: Path) -> None:
    db, so = f"sqlite:///{tmp_path / 'tf.db'}", tmp_path / "net.so"
    tuned = _cli("tune-model", str(USER_NET), "--trials", "12", "--round-trials", "4", db=db)
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    assert re.search(r"; 12 trials in \d+ rounds", tuned.stdout), tuned.stdout[-3000:]
    # the encoder layer's `take` (q, k, v out of one projection) is a task like any other: the
    # heaviest by calls, so it is tuned first
    assert re.search(r"take\d*\s+│\s+3\s+│\s+\d+\s+│\s+[\d.]+ [mun]?s", tuned.stdout), tuned.stdout
    assert "refused" not in tuned.stdout and "failed" not in tuned.stdout, tuned.stdout
    assert "tasks without a tuned schedule" in tuned.stdout  # 12 trials cannot cover them all

    built = _cli("build", str(USER_NET), "-o", str(so), db=db)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    n = re.search(r"wrote \S+: (\d+) of (\d+) tasks with a tuned schedule", built.stdout)
    assert n and 0 < int(n[1]) < int(n[2]), built.stdout
    assert re.search(r"warning: \d+% of the model's operations run in tasks without a tuned "
                     "schedule", built.stdout), built.stdout
    inputs, want = _torch_reference(USER_NET)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    got = (got[0] if not hasattr(got, "numpy") else got).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    assert not np.allclose(got, want + 1e-2, rtol=1e-3, atol=1e-3)  # the check can fail


def test_a_users_module_class_is_exported(tmp_path: Path) -> None:
    mod = load_model(USER_NET)
    names = [t.name for t in extract(partition(mod, "host"), make_target("host"))]
    assert any(n.startswith("take") for n in names), names
    assert any("conv2d" in n for n in names) and any("softmax" in n for n in names), names


RELAX_IN_MODEL = '''
from tvm.script import ir as I
from tvm.script import relax as R


def model():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 4), "float32")):
            with R.dataflow():
                y = R.nn.relu(R.matmul(x, w))
                R.output(y)
            return y

    return Module
'''


def test_relax_tvmscript_written_inside_model_loads(tmp_path: Path) -> None:
    p = tmp_path / "tutorial_mlp.py"
    p.write_text(RELAX_IN_MODEL)
    (task,) = extract(partition(load_model(p), "host"), make_target("host"))
    assert "matmul" in task.name
    assert "tunefarm_model_tutorial_mlp" not in sys.modules  # imported for the call only


MULTI = '''
import torch


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)

    def forward(self, input, *, scale):
        return {"a": self.a(input) * scale, "b": torch.relu(self.b(input))}


def model():
    torch.manual_seed(0)
    return TwoHeads()


def example_inputs():
    return (torch.randn(3, 8),), {"scale": torch.full((1,), 2.0)}
'''


def test_keyword_inputs_and_a_dict_of_outputs(tmp_path: Path) -> None:
    p = tmp_path / "two_heads.py"
    p.write_text(MULTI)
    mod = load_model(p)
    assert len(mod["main"].params) == 2
    ex = tvm.compile(mod, target="llvm")
    x, scale = torch.randn(3, 8), torch.full((1,), 2.0)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()),
                                                      tvm.runtime.tensor(scale.numpy()))
    torch.manual_seed(0)
    net = torch.nn.Module()
    net.a, net.b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)
    with torch.inference_mode():
        want = [net.a(x) * scale, torch.relu(net.b(x))]
    for got, ref in zip(out, want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_an_operator_the_frontend_lacks_is_named(tmp_path: Path) -> None:
    p = tmp_path / "fft.py"
    p.write_text("import torch\n"
                 "class F(torch.nn.Module):\n"
                 "    def forward(self, x):\n"
                 "        return torch.fft.rfft(x).abs()\n"
                 "def model():\n    return F()\n"
                 "def example_inputs():\n    return torch.randn(4, 16)\n")
    with pytest.raises(SpecError, match=r"cannot convert the model to relax: TVM.s torch "
                                        r"frontend has no conversion for .*fft"):
        load_model(p)
