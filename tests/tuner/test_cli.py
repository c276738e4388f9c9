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

import psutil
import pytest

from tuner.db import JobState, Store

TARGET = json.dumps({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def _cli() -> list[str]:
    exe = shutil.which("tunefarm")
    return [exe] if exe else [sys.executable, "-m", "tuner"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUNEFARM_DATA_DIR": str(tmp_path / "data"), "TUNEFARM_MIN_REPEAT_MS": "2",
            "TUNEFARM_REPEATS": "3", "COLUMNS": "200"}


def run(args: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cli() + args, capture_output=True, text=True, timeout=timeout,
                          env=_env(tmp_path))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", "matmul", "--shape", "0,4,4"], "shape[0]"),
        (["tune", "matmul", "--shape", "4,4"], "shape"),
        (["tune", "convolution", "--shape", "4,4,4"], "unknown op"),
        (["tune", "matmul", "--shape", "4,4,4", "--target", "llvm -mcpu=znver4"], "not a target"),
        (["tune", "matmul", "--shape", "4,4,4", "-p", "dtype=int3"], "dtype"),
        (["tune", "tir"], "--tvmscript"),
        (["tune", "matmul", "--shape", "4,4,4", "--target", '{"kind": "cuda", "arch": "sm_80"}'],
         "does not run on this machine"),
        (["best", "matmul", "--shape", "8,8,8"], "tune it first"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], fragment: str, tmp_path: Path) -> None:
    out = run(args + ["--db", f"sqlite:///{tmp_path / 'x.db'}"], tmp_path, timeout=120)
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


@pytest.mark.slow
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
    assert rec["workload_key"].startswith("matmul-") and rec["target"]["mcpu"] == "znver4"
    assert rec["gflops"] == pytest.approx(2 * 64**3 / rec["latency_s"] / 1e9)
    assert isinstance(rec["trace"], list) and rec["latencies_s"]

    listed = run(["records", "--json", "--limit", "3", "--db", db_url], tmp_path)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 3
    store.close()
