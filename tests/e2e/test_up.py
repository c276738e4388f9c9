"""The quick start of the service (docs/service.md), as a user types it: `tunefarm up`, then
`tunefarm submit` in another terminal; Ctrl-C stops everything `up` started, and starting it
again reuses the tokens it saved (mode 0600) instead of minting new ones."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import kill_group
from tests.e2e.farm import free_port

pytestmark = pytest.mark.slow


def _start_up(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """`tunefarm up`, once it printed that everything is up (its API answers) and where the
    user token is (the line after)."""
    with log.open("ab") as out:
        up = subprocess.Popen([sys.executable, "-m", "tuner", "up", "--port", str(port)],
                              env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.monotonic() + 90
    while ("(`tunefarm submit` uses it)" not in log.read_text() and up.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.2)
    if "(`tunefarm submit` uses it)" not in log.read_text():
        kill_group(up)
        pytest.fail(f"`tunefarm up` did not come up: {log.read_text()[-3000:]}")
    return up


def test_up_then_submit_then_ctrl_c(private_redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "TUNEFARM_DATA_DIR": str(tmp_path / "data"),
           "TUNEFARM_REDIS_URL": private_redis_url, "TUNEFARM_API_URL": f"http://127.0.0.1:{port}",
           "TUNEFARM_MIN_REPEAT_MS": "2", "TUNEFARM_REPEATS": "3", "COLUMNS": "200"}
    env.pop("TUNEFARM_DATABASE_URL", None)  # the default: SQLite in the data directory
    env.pop("TUNEFARM_TOKEN", None)
    log = tmp_path / "up.log"
    up = _start_up(env, port, log)
    try:
        token_file = tmp_path / "data" / "token"
        saved = {f: (tmp_path / "data" / f).read_text() for f in ("token", "worker-token")}
        for f in saved:
            assert (tmp_path / "data" / f).stat().st_mode & 0o777 == 0o600
        children = psutil.Process(up.pid).children()
        assert len(children) == 3
        out = subprocess.run([sys.executable, "-m", "tuner", "submit", "matmul", "--shape",
                              "32,32,32", "--trials", "4"], env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr + log.read_text()
        assert "SUCCEEDED: 4/4 trials" in out.stdout
        # the processes' lines, each with its process's name in front (the API logs nothing here)
        logged = log.read_text()
        assert re.search(r"^worker \| .*measures device key", logged, re.M), logged[-3000:]
        assert re.search(r"^tuner  \| .*runs job", logged, re.M), logged[-3000:]
        up.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.wait(timeout=90) == 0
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]

        log.write_bytes(b"")
        up = _start_up(env, port, log)  # a second start: the saved tokens still authenticate
        assert {f: (tmp_path / "data" / f).read_text() for f in saved} == saved
        assert f"user token reused from {token_file}" in log.read_text()
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=90) == 0
    finally:
        kill_group(up)
