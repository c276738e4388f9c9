"""A whole model on the farm, as a user types it: `tunefarm tune-model --api` extracts the tasks
here and submits them as a model job; the service's tuner and a worker process tune every task;
`tunefarm build --api` compiles the model with the service's schedules (GET /v1/best with a
token, no SQL), finds every task, and the built model computes what relax computes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.farm import TARGET, Farm, running_farm
from tests.model.test_model import MODEL_PY, REPO, _reference

pytestmark = pytest.mark.slow


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path) as f:
        yield f


def _cli(farm: Farm, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in farm.env.items() if k != "TUNEFARM_DATABASE_URL"}  # API only
    return subprocess.run([sys.executable, "-m", "tuner", *args, "--api", farm.api_url,
                           "--token", farm.user_token, "--target", json.dumps(TARGET),
                           "--device-key", "e2e"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=400, check=False)


def test_a_model_is_tuned_on_the_farm_and_built_through_the_api(farm: Farm,
                                                                tmp_path: Path) -> None:
    from tuner.core.tvm_api import relax, tvm
    from tuner.model.load import load_model

    model = tmp_path / "mlp.py"
    model.write_text(MODEL_PY)
    farm.start_tuner()
    farm.start_worker("w1")

    tuned = _cli(farm, "tune-model", str(model), "--trials", "12", "--round-trials", "4")
    out = tuned.stdout + tuned.stderr
    assert tuned.returncode == 0, out[-3000:] + farm.logs()
    assert re.search(r"model job \w+ RUNNING: 2 tasks, 12 trials", out), out
    assert "SUCCEEDED: " in out and "fused_matmul_relu" in out and "softmax" in out, out
    model_id = re.search(r"model job (\w+)", out).group(1)  # type: ignore[union-attr]
    job = farm.client().get_model(model_id)
    assert job["state"] == "SUCCEEDED" and job["trials_done"] <= 12, job
    assert all(t["best_s"] is not None for t in job["tasks"]), job
    assert job["estimates"][-1][1] is not None and job["estimates"][0][1] is None

    so = tmp_path / "model.so"
    built = _cli(farm, "build", str(model), "-o", str(so))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert "2 of 2 tasks with a tuned schedule" in built.stdout, built.stdout
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
    x = np.random.default_rng(1).uniform(-1, 1, (32, 64)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(load_model(model), x), rtol=1e-4, atol=1e-5)
