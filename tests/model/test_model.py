"""Whole models: loading, partitioning and extraction, `tunefarm tune-model` and `tunefarm
build` as a user types them, and the MetaSchedule JSON interop (`tunefarm db export/import`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.core.errors import SpecError
from tuner.core.tvm_api import make_target, ms, relax, tvm
from tuner.model.load import load_model
from tuner.model.pipeline import extract, partition

REPO = Path(__file__).resolve().parents[2]

# Two matmul + relu layers of the same shape (one task, called twice) and a softmax; weights are
# constants, as a model's are.
MODEL_PY = """
import numpy as np
from tvm import relax


def model():
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    w1, w2 = (relax.const(rng.uniform(-1, 1, (64, 64)).astype("float32")) for _ in range(2))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w1)))
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(h, w2)))
            out = bb.emit_output(relax.op.nn.softmax(h))
        bb.emit_func_output(out)
    return bb.get()
"""


@pytest.fixture
def model_py(tmp_path: Path) -> Path:
    p = tmp_path / "mlp.py"
    p.write_text(MODEL_PY)
    return p


def _reference(mod: Any, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_python_model_partitions_into_merged_tasks(model_py: Path) -> None:
    tasks = extract(partition(load_model(model_py), "host"), make_target("host"))
    by_name = {re.sub(r"\d+$", "", t.name): t for t in tasks}
    assert set(by_name) == {"fused_matmul_relu", "softmax"}, [t.name for t in tasks]
    assert by_name["fused_matmul_relu"].weight == 2 and by_name["softmax"].weight == 1
    assert tasks[0].name.startswith("fused_matmul_relu")  # heaviest first


def test_the_readmes_example_model_has_three_tasks() -> None:
    tasks = extract(partition(load_model(REPO / "bench" / "example_model.py"), "host"),
                    make_target("host"))
    names = sorted(re.sub(r"\d+", "", t.name) for t in tasks)
    assert names == ["fused_matmul_add_add", "fused_matmul_add_gelu", "layer_norm"], names


def test_a_tvmscript_model_is_parsed_not_run(tmp_path: Path) -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 4), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    p = tmp_path / "m.relax"
    p.write_text(bb.get().script())
    (task,) = extract(partition(load_model(p), "host"), make_target("host"))
    assert task.weight == 1 and "matmul" in task.name


@pytest.mark.parametrize("text,match", [
    (None, "does not exist"),
    ("import os\n", "no model\\(\\) function"),
    ("def model():\n    return 3\n", "not a relax IRModule"),
])
def test_a_bad_python_model_is_named(tmp_path: Path, text: str | None, match: str) -> None:
    p = tmp_path / "bad.py"
    if text is not None:
        p.write_text(text)
    with pytest.raises(SpecError, match=match):
        load_model(p)


def test_bad_tvmscript_is_a_spec_error(tmp_path: Path) -> None:
    p = tmp_path / "m.relax"
    p.write_text("this is not TVMScript(")
    with pytest.raises(SpecError, match="not a relax module"):
        load_model(p)


def test_a_torch_model_goes_through_torch_export(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    p = tmp_path / "tiny.py"
    p.write_text(
        "import torch\n"
        "def model():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.GELU())\n"
        "def example_inputs():\n"
        "    return (torch.randn(4, 32),)\n")
    mod = load_model(p)
    names = [t.name for t in extract(partition(mod, "host"), make_target("host"))]
    assert any("matmul" in n for n in names), names
    net = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.GELU())
    ep = torch.export.export(net.eval(), (torch.randn(4, 32),))
    torch.export.save(ep, str(tmp_path / "tiny.pt2"))
    assert isinstance(load_model(tmp_path / "tiny.pt2"), tvm.IRModule)


def _cli(*args: str, env_db: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args, "--db", env_db], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_tune_model_then_build_then_export_and_import(model_py: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tf.db'}"
    so = tmp_path / "model.so"
    untuned = _cli("build", str(model_py), "-o", str(so), env_db=url)
    assert untuned.returncode == 0, untuned.stderr[-2000:]
    assert "0 of 2 tasks with a tuned schedule" in untuned.stdout, untuned.stdout

    tuned = _cli("tune-model", str(model_py), "--trials", "24", "--round-trials", "8",
                 env_db=url)
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    est = re.search(r"estimated model latency (\S+ \S+) -> (\S+ \S+); 24 trials", tuned.stdout)
    assert est, tuned.stdout
    assert "fused_matmul_relu" in tuned.stdout and "softmax" in tuned.stdout
    # a bar per round of the task scheduler, each with its task and its trials
    assert re.search(r"round 1 \S+ .* \d+/\d+", tuned.stdout), tuned.stdout[-3000:]

    again = _cli("tune-model", str(model_py), "--trials", "24", env_db=url)  # already spent
    assert again.returncode == 0 and "0 rounds" in again.stdout, again.stdout[-2000:]

    built = _cli("build", str(model_py), "-o", str(so), env_db=url)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "2 of 2 tasks with a tuned schedule" in built.stdout, built.stdout
    assert re.search(r"run it with TVM_NUM_THREADS=\d+ set", built.stdout), built.stdout
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
    x = np.random.default_rng(1).uniform(-1, 1, (32, 64)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(load_model(model_py), x), rtol=1e-4, atol=1e-5)

    out = tmp_path / "msdb"
    exported = _cli("db", "export", str(out), "--format", "metaschedule", env_db=url)
    assert exported.returncode == 0, exported.stderr[-2000:]
    # softmax-x86 tensorizes with tunefarm's own intrinsics: stock TVM loads and replays its
    # records once they are registered in the process (docs/models.md)
    from schedules.intrinsics import register_all

    assert "div_bcast_recip_f32x16" in register_all()
    stock = ms.database.JSONDatabase(str(out / "database_workload.json"),
                                     str(out / "database_tuning_record.json"))
    n = len(stock)
    assert n >= 24  # every record, valid or not
    for wl in {id(r.workload): r.workload for r in stock.get_all_tuning_records()}.values():
        (best,) = stock.get_top_k(wl, 1)  # stock TVM ranks and replays what was exported
        best.as_measure_candidate()

    home = _cli("db", "import", str(out), env_db=url)  # its own export: nothing added twice
    assert home.returncode == 0 and f"added 0 ({n} already stored)" in home.stdout, home.stdout
    other = f"sqlite:///{tmp_path / 'other.db'}"
    first = _cli("db", "import", str(out), env_db=other)
    assert first.returncode == 0 and f"read {n} records" in first.stdout, first.stdout
    second = _cli("db", "import", str(out), env_db=other)
    assert f"added 0 ({n} already stored)" in second.stdout, second.stdout
    rebuilt = _cli("build", str(model_py), "-o", str(so), env_db=other)
    assert "2 of 2 tasks with a tuned schedule" in rebuilt.stdout, rebuilt.stdout


# Two residual-style convolutions: conv + bias + relu, then conv + scale + shift + the first's
# output added + relu (each one fused task of relax's), weights constants.
CONV_MODEL_PY = """
import numpy as np
from tvm import relax


def model():
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const(rng.uniform(-1, 1, shape).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.conv2d(x, const(16, 8, 3, 3), padding=1))
            h = bb.emit(relax.op.nn.relu(relax.op.add(h, const(1, 16, 1, 1))))
            y = bb.emit(relax.op.nn.conv2d(h, const(16, 16, 3, 3), padding=1))
            y = bb.emit(relax.op.add(relax.op.multiply(y, const(1, 16, 1, 1)), const(1, 16, 1, 1)))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, h)))
        bb.emit_func_output(out)
    return bb.get()
"""


@pytest.mark.slow
def test_a_conv_model_is_tuned_by_the_conv_template_and_built_without_fallbacks(
        tmp_path: Path) -> None:
    from tuner.db import Store

    model_py = tmp_path / "convnet.py"
    model_py.write_text(CONV_MODEL_PY)
    url = f"sqlite:///{tmp_path / 'tf.db'}"
    tuned = _cli("tune-model", str(model_py), "--trials", "16", "--round-trials", "8",
                 env_db=url)
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    rows = Store(url).records()
    assert len(rows) == 16 and {r.space for r in rows} == {"conv2d-nchwc-x86"}, \
        {r.space for r in rows}
    so = tmp_path / "convnet.so"
    built = _cli("build", str(model_py), "-o", str(so), env_db=url)  # a process of its own
    assert built.returncode == 0, built.stderr[-2000:]
    assert "2 of 2 tasks with a tuned schedule" in built.stdout, built.stdout
    assert re.search(r"run it with TVM_NUM_THREADS=\d+ set", built.stdout), built.stdout
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(load_model(model_py), x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_killed_model_job_resumes_without_measuring_twice(model_py: Path,
                                                            tmp_path: Path) -> None:
    import os
    import signal
    import time
    from collections import Counter

    from tuner.db import Store

    url = f"sqlite:///{tmp_path / 'tf.db'}"
    args = [sys.executable, "-m", "tuner", "tune-model", str(model_py), "--trials", "24",
            "--round-trials", "8", "--db", url]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                with Store(url) as s:
                    if s.count_records() >= 10:  # inside the second round
                        break
            except Exception:  # the schema is being created
                continue
        assert proc.poll() is None, "tune-model ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with Store(url) as s:
        before = s.count_records()
    assert 10 <= before < 24

    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600,
                           check=False)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "24 trials" in again.stdout, again.stdout[-2000:]
    with Store(url) as s:
        rows = s.records()
    assert len(rows) == 24  # the budget, counting what the killed run committed
    per_candidate = Counter((r.workload_id, r.cand_hash) for r in rows)
    assert max(per_candidate.values()) == 1  # no candidate measured twice


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_fast_math_gelu_computes_gelu_without_libm_calls(tmp_path: Path, act: str) -> None:
    from tuner.db import Store
    from tuner.interop.ms_database import TunefarmDatabase
    from tuner.model.pipeline import build

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 256), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op.nn, act)(x))
        bb.emit_func_output(out)
    mod = bb.get()
    target = make_target("host")
    plain = extract(partition(mod, target), target)
    fast = extract(partition(mod, target, fast_math=True), target)
    libm = "T.erf(" if act == "gelu" else "T.tanh("
    assert any(libm in t.func.script() for t in plain)
    assert not any(libm in t.func.script() for t in fast)
    db = TunefarmDatabase(Store(f"sqlite:///{tmp_path / 'tf.db'}"))
    xs = np.random.default_rng(0).uniform(-6, 6, (16, 256)).astype("float32")
    outs = []
    for fm in (False, True):
        vm = relax.VirtualMachine(build(mod, target, db, fast_math=fm).executable, tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(xs)).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def test_a_padded_weight_is_packed_once_at_build_time(tmp_path: Path) -> None:
    """N off the 16 grid: `gemm-x86` pads the weight as it packs it, which is no plain copy;
    tunefarm's pipeline still splits that packing off and folds it on the bound weight, so the
    built kernel takes the packed weight and computes the model's output."""
    from schedules import registry
    from tests.schedules.test_spaces import sample_points
    from tuner.db import Store
    from tuner.interop.ms_database import TunefarmDatabase
    from tuner.model.pipeline import apply, build
    from tuner.workloads import parse_spec

    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (40, 48)).astype("float32")  # linear: [N, K], N = 40 -> 48
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 48), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.linear(x, relax.const(w))))
        bb.emit_func_output(out)
    mod = bb.get()
    target = make_target("host")
    (task,) = extract(partition(mod, target), target)
    wl = parse_spec({"op": "tir", "tvmscript": task.func.script()})
    space = registry.space_generator("gemm-x86", wl, target)
    (sch,) = sample_points(space, wl, target, n=1)[:1]
    db = TunefarmDatabase(Store(f"sqlite:///{tmp_path / 'tf.db'}"))
    task_mod = tvm.IRModule({"main": task.func})
    db.commit_tuning_record(ms.database.TuningRecord(
        trace=sch.trace, workload=db.commit_workload(task_mod), run_secs=[1e-5], target=target,
        args_info=ms.arg_info.ArgInfo.from_prim_func(task.func)))

    applied, _, untuned = apply(mod, target, db)
    assert not untuned
    funcs = {gv.name_hint: f for gv, f in applied.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    (kernel,) = [f for name, f in funcs.items() if name.endswith("_prepacked")]
    assert [tuple(int(d) for d in p.shape) for p in kernel.params][1] == (3, 48, 16)
    assert "if_then_else" not in kernel.script()  # the padding is not in the kernel
    main = applied["main"].script()
    (packing,) = [name for name in funcs if name.endswith("_weight_prepack")]
    assert packing not in main, main  # folded on the weight: main never calls it

    xs = rng.uniform(-1, 1, (64, 48)).astype("float32")
    vm = relax.VirtualMachine(build(mod, target, db).executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_allclose(got, np.maximum(xs @ w.T, 0), rtol=1e-4, atol=1e-4)
