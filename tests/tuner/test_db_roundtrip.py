"""`tunefarm db export` then `db import`, as a user types them: importing a database's own
export adds nothing, and into a fresh database the records are found by their op spec again
(the workload keys survive the round trip through MetaSchedule's JSON files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHAPE = "32,32,32"

pytestmark = pytest.mark.timeout(600)


def _cli(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args, "--db", db], cwd=REPO,
                          capture_output=True, text=True, timeout=500, check=False,
                          env={**os.environ, "TVM_NUM_THREADS": "1"})


def test_export_import_keeps_keys_and_adds_nothing_twice(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    tuned = _cli("tune", "matmul", "--shape", SHAPE, "--trials", "6", db=db)
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    best = _cli("best", "matmul", "--shape", SHAPE, "--json", db=db)
    assert best.returncode == 0, best.stderr[-2000:]
    before = json.loads(best.stdout)

    out = tmp_path / "msdb"
    exported = _cli("db", "export", str(out), "--format", "metaschedule", db=db)
    assert exported.returncode == 0, exported.stderr[-2000:]
    n = int(re.search(r"exported (\d+) records", exported.stdout)[1])  # type: ignore[index]
    assert n >= 6 and (out / "tunefarm_workloads.json").is_file()

    home = _cli("db", "import", str(out), db=db)
    assert home.returncode == 0 and f"added 0 ({n} already stored)" in home.stdout, home.stdout

    fresh = f"sqlite:///{tmp_path / 'b.db'}"
    first = _cli("db", "import", str(out), db=fresh)
    assert first.returncode == 0 and f"added {n} (0 already stored)" in first.stdout, first.stdout
    again = _cli("db", "import", str(out), db=fresh)
    assert f"added 0 ({n} already stored)" in again.stdout, again.stdout
    found = _cli("best", "matmul", "--shape", SHAPE, "--json", db=fresh)
    assert found.returncode == 0, found.stdout + found.stderr[-2000:]
    after = json.loads(found.stdout)
    assert after["workload_key"] == before["workload_key"]
    assert after["latency_s"] == pytest.approx(before["latency_s"])
