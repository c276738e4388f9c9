"""The model zoo (`bench/zoo.py`) at its small scale: every architecture goes through
`torch.export`, TVM's frontend and tunefarm's pipeline; every one of its tasks passes the `tir`
checks the service applies (none refused); and the library `tunefarm build` writes (no records
yet: relax's default loops, the fallback of every untuned task) computes what PyTorch eager
computes. Needs the `zoo` extra (torch, transformers), which CI installs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.zoo import ZOO
from tuner.core.tvm_api import relax, tvm
from tuner.db.store import Store
from tuner.interop.ms_database import TunefarmDatabase
from tuner.model.job import vet_tasks
from tuner.model.load import from_torch
from tuner.model.pipeline import build


def test_the_zoo_has_what_users_bring() -> None:
    kinds = [m.kind for m in ZOO.values()]
    assert len(ZOO) >= 12 and kinds.count("cnn") >= 3 and kinds.count("decoder") >= 3


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_zoo_model_builds_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    import torch

    net, inputs = ZOO[name].make("small")
    with torch.inference_mode():
        want = net(*inputs).numpy()
    mod = from_torch(net, inputs, where=name)
    db = TunefarmDatabase(Store(f"sqlite:///{tmp_path / 'empty.db'}"), "local")
    built = build(mod, "host", db)
    kept, _, refused = vet_tasks(built.tasks)
    assert refused == [] and len(kept) == len(built.tasks) > 0
    assert sorted(built.untuned) == sorted(t.name for t in built.tasks)  # nothing tuned yet
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    assert got.shape == want.shape and np.abs(want).max() > 1e-3  # a real output to compare
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
