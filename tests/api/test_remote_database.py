"""`RemoteDatabase`: a relax build that reaches the farm only through `GET /v1/best` and a token
builds the same module as one reading the SQL database."""

from __future__ import annotations

from typing import Any

import pytest

PG = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _model() -> Any:
    import numpy as np

    from tuner.core.tvm_api import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.const(rng.uniform(-1, 1, (32, 32)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            out = bb.emit_output(relax.op.nn.softmax(h))
        bb.emit_func_output(out)
    return bb.get()


@PG
@pytest.mark.timeout(300)
def test_remote_database_builds_what_the_sql_database_builds(
        live_server: tuple[str, Any]) -> None:
    from api.client import Client
    from api.client.ms_database import RemoteDatabase
    from tuner.core.tvm_api import host_target_dict, make_target, structural_equal
    from tuner.db.tokens import create_token
    from tuner.interop.ms_database import TunefarmDatabase
    from tuner.measure import MeasureOptions
    from tuner.measure.local import LocalMeasurer
    from tuner.model.job import ModelRequest, ModelTuner
    from tuner.model.pipeline import apply, extract, partition

    url, app = live_server
    store = app.state.ctx.store
    target = host_target_dict()
    mod = _model()
    tasks = extract(partition(mod, target), make_target(target))
    with LocalMeasurer() as measurer:
        summary = ModelTuner(store, measurer).run(ModelRequest(
            tasks=tasks, target=target, trials=8, round_trials=4, batch_size=4,
            options=MeasureOptions(repeats=2, min_repeat_ms=1)))
    assert summary.trials == 8 and all(t.best_s is not None for t in summary.tasks)

    by_sql, tasks_sql, untuned_sql = apply(mod, target, TunefarmDatabase(store, ranking="median"))
    with Client(url, create_token(store, "user")) as client:
        remote = RemoteDatabase(url, None, client=client)
        by_api, _, untuned_api = apply(mod, target, remote)
        assert untuned_sql == untuned_api == []
        assert structural_equal(by_sql, by_api)
        # nothing known for another target: the build keeps relax's loops, no error
        other = {**target, "mcpu": "skylake-avx512"}
        _, _, untuned_other = apply(mod, other, remote)
        assert len(untuned_other) == len(tasks_sql)
        with pytest.raises((NotImplementedError, RuntimeError), match="read-only"):
            remote.commit_workload(mod)
