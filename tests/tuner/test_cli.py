"""The CLI as a user runs it: real processes, a real database; SIGKILL mid-tune and resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.targets import RUN_X86
from tuner.db import JobState, Store
from tuner.measure import Invalidity

TARGET = json.dumps(RUN_X86)


def _cli() -> list[str]:
    exe = shutil.which("tunefarm")
    return [exe] if exe else [sys.executable, "-m", "tuner"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUNEFARM_DATA_DIR": str(tmp_path / "data"),
            "TUNEFARM_MIN_REPEAT_MS": "2", "TUNEFARM_REPEATS": "3", "COLUMNS": "200"}


def run(args: list[str], tmp_path: Path, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cli() + args, capture_output=True, text=True, timeout=timeout,
                          env={**_env(tmp_path), **(env or {})})


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", "matmul", "--shape", "0,4,4"], "shape[0]"),
        (["tune", "matmul", "--shape", "4,4"], "shape"),
        (["tune", "convolution", "--shape", "4,4,4"], "unknown op"),
        (["tune", "matmul", "--shape", "4,4,4", "--target", "llvm -mcpu=znver4"], "not a target"),
        (["tune", "matmul", "--shape", "4,4,4", "-p", "dtype=int3"], "dtype"),
        (["tune", "tir"], "--tvmscript"),
        (["tune", "tir", "--tvmscript", "/nonexistent/k.py"], "cannot read /nonexistent/k.py"),
        (["spaces", "--tvmscript", "/nonexistent/k.py"], "cannot read /nonexistent/k.py"),
        # TVM 0.27's dialect: the mistakes of a TVMScript written for 0.26 come with a hint
        (["tune", "tir", "--tvmscript", "{no_s_tir}"], "@T.prim_func(s_tir=True)"),
        (["tune", "tir", "--tvmscript", "{tir_import}"], "renamed the tir script module tirx"),
        (["tune", "matmul", "--shape", "4,4,4", "--target", '{"kind": "cuda", "arch": "sm_80"}'],
         "does not run on this machine"),
        (["best", "matmul", "--shape", "8,8,8"], "tune it first"),
        # the API's target allowlist, cores bounded by this machine's
        (["tune", "matmul", "--shape", "4,4,4", "--target", '{"kind": "llvm", "num-cores": 0}'],
         "target.num-cores: must be an integer from 1 to"),
        (["tune", "matmul", "--shape", "4,4,4", "--target", '{"kind": "llvm", "num-cores": 512}'],
         "target.num-cores"),
        (["tune", "matmul", "--shape", "4,4,4", "--target",
          '{"kind": "llvm", "cl-opt": ["-x86-asm-syntax=intel"]}'], "target.cl-opt"),
        # text from outside is printed as it is, never read as rich markup (this raised
        # MarkupError with a traceback)
        (["tune", "matmul", "--shape", "4,4,4", "--target", '{"kind": "[/x]"}'], "'[/x]'"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], fragment: str, tmp_path: Path) -> None:
    from tests.support.tasks import RELU

    files = {"no_s_tir": RELU.replace("@T.prim_func(s_tir=True)", "@T.prim_func"),
             "tir_import": RELU.replace("tirx as T", "tir as T")}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    for name in files:
        args = [a.replace(f"{{{name}}}", str(tmp_path / f"{name}.py")) for a in args]
    db = [] if args[0] == "spaces" else ["--db", f"sqlite:///{tmp_path / 'x.db'}"]
    out = run([*args, *db], tmp_path, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr


def test_db_upgrade(tmp_path: Path) -> None:
    out = run(["db", "upgrade", "--db", f"sqlite:///{tmp_path / 'u.db'}"], tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "revision" in out.stdout


def _wait_for_records(url: str, n: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    store = Store(url)
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "tune ended before it could be killed"
            if store.count_records() >= n:
                return
            time.sleep(0.2)
    finally:
        store.close()
    raise AssertionError(f"fewer than {n} records after {timeout} s")


# SQLite, the CLI's own database; a SIGKILL on PostgreSQL is tests/e2e/test_faults.py's (the
# service's tuner and worker)
@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sigkill_loses_no_record_and_the_rerun_resumes(db_url: str, tmp_path: Path) -> None:
    args = ["tune", "matmul", "--shape", "64,64,64", "--trials", "10", "--batch-size", "4",
            "--target", TARGET, "--db", db_url]
    proc = subprocess.Popen(_cli() + args, env=_env(tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_records(db_url, 5, proc, timeout=240)
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the sandbox runs in its own session; it must not outlive the killed tuner
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"left running: {[c.cmdline() for c in alive]}"

    store = Store(db_url)
    before = {r.trial_id: r for r in store.records()}
    assert len(before) >= 5
    job_id = next(iter(before.values())).job_id
    job = store.get_job(job_id)
    assert job is not None and job.state == JobState.RUNNING  # it never got to finish

    out = run(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    after = store.records()
    assert len(after) == 10
    assert {r.job_id for r in after} == {job_id}
    assert len({r.cand_hash for r in after}) == 10  # nothing measured twice
    kept = {r.trial_id: r for r in after}
    for tid, r in before.items():  # every committed record survived unchanged
        assert kept[tid].latencies == r.latencies and kept[tid].invalidity == r.invalidity
    job = store.get_job(job_id)
    assert job is not None and job.state == JobState.SUCCEEDED

    # the same command again measures nothing
    again = run(args, tmp_path)
    assert again.returncode == 0 and "nothing to measure" in again.stdout
    assert store.count_records() == 10

    best = run(["best", "matmul", "--shape", "64,64,64", "--target", TARGET, "--db", db_url,
                "--json"], tmp_path)
    assert best.returncode == 0, best.stderr
    rec = json.loads(best.stdout)
    fastest = min((r for r in after if r.median_s is not None), key=lambda r: r.median_s)
    assert rec["trial_id"] == fastest.trial_id and rec["invalidity"] == "ok"
    assert rec["workload_key"].startswith("matmul-") and rec["target"]["mcpu"] == RUN_X86["mcpu"]
    assert rec["gflops"] == pytest.approx(2 * 64**3 / rec["latency_s"] / 1e9)
    assert isinstance(rec["trace"], list) and rec["latencies_s"]

    listed = run(["records", "--json", "--limit", "3", "--db", db_url], tmp_path)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 3
    # filtered by job and result: this job's valid records, none of another job
    valid = [r for r in after if r.invalidity == Invalidity.OK and r.median_s is not None]
    mine = run(["records", "--json", "--limit", "50", "--job", job_id, "--ok", "--db", db_url],
               tmp_path)
    assert mine.returncode == 0, mine.stderr
    assert {r["trial_id"] for r in json.loads(mine.stdout)} == {r.trial_id for r in valid}
    none = run(["records", "--json", "--job", "no-such-job", "--db", db_url], tmp_path)
    assert none.returncode == 0 and json.loads(none.stdout) == []
    store.close()


# --- tokens: `tunefarm token create|list|revoke` and the tokens `tunefarm up` keeps ----------


def _tf(*args: str) -> Any:
    from typer.testing import CliRunner

    from tuner.cli import app

    return CliRunner().invoke(app, list(args))


def test_token_create_list_revoke(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 't.db'}"
    made = _tf("token", "create", "--scope", "worker", "--name", "rack", "--expires-in", "2h",
               "--device-key", "zen5", "--db", db)
    assert made.exit_code == 0, made.output
    tok = made.stdout.strip()
    assert tok.startswith("tf_") and "\n" not in tok and "expires" in made.stderr
    forever = _tf("token", "create", "--name", "rack", "--scope", "worker", "--expires-in",
                  "never", "--db", db)
    assert forever.exit_code == 0 and "never expires" in forever.stderr
    assert _tf("token", "create", "--name", "ci", "--db", db).exit_code == 0  # default: 90d

    listed = _tf("token", "list", "--json", "--db", db)
    assert listed.exit_code == 0 and tok not in listed.output and "hash" not in listed.output
    rows = {(t["name"], t["id"]): t for t in json.loads(listed.stdout)}
    assert [t["id"] for t in rows.values()] == [3, 2, 1]  # newest first
    assert rows["rack", 1]["device_key"] == "zen5" and rows["rack", 1]["state"] == "active"
    assert rows["rack", 2]["expires_at"] is None and rows["ci", 3]["expires_at"] is not None
    table = _tf("token", "list", "--db", db)
    assert table.exit_code == 0 and "rack" in table.stdout and tok not in table.stdout

    assert _tf("token", "revoke", "3", "--db", db).exit_code == 0
    assert _tf("token", "revoke", "3", "--db", db).exit_code == 0  # idempotent
    by_name = _tf("token", "revoke", "--name", "rack", "--db", db)
    assert by_name.exit_code == 0 and by_name.stdout.count("revoked token") == 2
    states = {t["id"]: t["state"] for t in json.loads(_tf("token", "list", "--json", "--db",
                                                           db).stdout)}
    assert states == {1: "revoked", 2: "revoked", 3: "revoked"}


@pytest.mark.parametrize(("args", "fragment"), [
    (["create", "--expires-in", "1w"], "expires-in"),
    (["create", "--expires-in", "0d"], "expires-in"),
    (["create", "--name", "local"], "reserved"),
    (["create", "--name", "token-12"], "reserved"),
    (["create", "--scope", "root"], "unknown scope"),
    (["create", "--scope", "user", "--device-key", "zen5"], "only worker tokens"),
    (["revoke", "42"], "no token 42"),
    (["revoke", "--name", "nobody"], "no unrevoked token named 'nobody'"),
    (["revoke"], "name one token id"),
    (["revoke", "1", "--name", "x"], "name one token id"),
])
def test_token_bad_input_is_a_clear_error(args: list[str], fragment: str, tmp_path: Path) -> None:
    out = _tf("token", *args, "--db", f"sqlite:///{tmp_path / 't.db'}")
    assert out.exit_code == 2, out.output
    assert fragment in out.stderr and "Traceback" not in out.output and "tf_" not in out.stdout


def _principal(store: Store, token: str) -> Any:
    from tuner.db.tokens import verify_token

    p = verify_token(store, token)
    assert p is not None
    return p


def test_up_reuses_its_saved_tokens(tmp_path: Path) -> None:
    from tuner.cli.tokens import up_tokens
    from tuner.db.tokens import create_token, list_tokens, revoke_token

    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "token").write_text("stale")
    (data / "token").chmod(0o644)
    first, reused = up_tokens(store, data, "local")
    assert not reused and len(list_tokens(store)) == 2
    for scope, fname in (("user", "token"), ("worker", "worker-token")):
        assert (data / fname).read_text().strip() == first[scope]
        assert (data / fname).stat().st_mode & 0o777 == 0o600
    assert _principal(store, first["worker"]).device_key == "local"

    again, reused = up_tokens(store, data, "local")
    assert reused and again == first and len(list_tokens(store)) == 2

    revoke_token(store, _principal(store, first["worker"]).token_id)
    third, reused = up_tokens(store, data, "local")
    assert not reused and third["user"] == first["user"] and third["worker"] != first["worker"]

    other_key, _ = up_tokens(store, data, "zen5")  # the worker's device key changed
    assert other_key["worker"] != third["worker"]
    (data / "token").write_text(other_key["worker"])  # a token of the wrong scope
    assert up_tokens(store, data, "zen5")[0]["user"] != first["user"]
    (data / "token").write_text(create_token(store, "user", "x", expires_in_s=3600))
    soon, reused = up_tokens(store, data, "zen5")  # expiring within a day: replaced
    assert not reused and _principal(store, soon["user"]).name == "tunefarm up"
    store.close()


def test_a_first_run_skips_nothing_as_already_measured(tmp_path: Path) -> None:
    """On an empty database nothing was measured before: a program the search proposes twice
    in one batch is measured once and is not reported as "already measured"."""
    import re

    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    out = run(["tune", "matmul", "--shape", "32,32,32", "--trials", "8", "--target", TARGET,
               "--db", db], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    skipped = re.search(r"skipped \(already measured\)\s*\S\s*(\d+)", out.stdout)
    assert skipped is not None and skipped[1] == "0", out.stdout[-2000:]


def test_tune_json_gives_the_summary_with_each_outcome_a_field(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'j.db'}"
    out = run(["tune", "matmul", "--shape", "32,32,32", "--trials", "4", "--target", TARGET,
               "--db", db, "--json"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout)  # stdout is the JSON alone: the progress went to stderr
    assert summary["trials"] == summary["trials_done"] == 4
    assert isinstance(summary["outcomes"], dict) and sum(summary["outcomes"].values()) == 4
    assert summary["best_s"] > 0 and summary["stop_reason"] == "budget reached"
    assert "tuning" in out.stderr
    assert summary["rate_unit"] == "GFLOPS"  # a 32^3 matmul: 5 flop per byte, compute-bound
    soft = run(["tune", "softmax", "--shape", "64,128", "--trials", "2", "--target", TARGET,
                "--db", db, "--json"], tmp_path,
               env={"TUNEFARM_PEAK_GBPS": '{"local": 20}'})
    assert soft.returncode == 0, soft.stderr[-2000:]
    assert json.loads(soft.stdout)["rate_unit"] == "GB/s"  # softmax: under 1 flop per byte
    assert "GB/s" in soft.stderr and "of 20)" in soft.stderr


def test_a_jobs_options_are_spelled_the_same_on_every_command_that_takes_them() -> None:
    import typer.main

    from tuner.cli import app

    group: Any = typer.main.get_command(app)
    opts = {name: {o for p in cmd.params if getattr(p, "param_type_name", "") == "option"
                   for o in p.opts} for name, cmd in group.commands.items()}
    job = {"--trials", "--device-key", "--target", "--seed", "--batch-size", "--wall-budget",
           "--wall-budget-s"}
    for name in ("tune", "submit", "tune-model"):
        assert job <= opts[name], (name, sorted(job - opts[name]))
    workload = {"--shape", "--param", "-p", "--tvmscript", "--space", "--early-stop"}
    for name in ("tune", "submit"):
        assert workload <= opts[name], (name, sorted(workload - opts[name]))
    for name in ("best", "records", "spaces"):
        assert {"--shape", "--param", "--tvmscript"} <= opts[name], name
    for name in ("submit", "jobs", "follow", "cancel", "tune-model", "build", "worker"):
        assert {"--api", "--token"} <= opts[name], name


def test_tune_stops_at_its_wall_budget(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'w.db'}"
    out = run(["tune", "matmul", "--shape", "32,32,32", "--trials", "500", "--target", TARGET,
               "--db", db, "--wall-budget", "1", "--json"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["stop_reason"] == "wall budget of 1 s reached", summary
    assert 0 < summary["trials_done"] < 500
