"""The README's quick start of the service, as a user types it: `tunefarm up`, then
`tunefarm submit` in another terminal; Ctrl-C stops everything `up` started."""

from __future__ import annotations

import os
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


def test_up_then_submit_then_ctrl_c(private_redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "TUNEFARM_DATA_DIR": str(tmp_path / "data"),
           "TUNEFARM_REDIS_URL": private_redis_url, "TUNEFARM_API_URL": f"http://127.0.0.1:{port}",
           "TUNEFARM_MIN_REPEAT_MS": "2", "TUNEFARM_REPEATS": "3", "COLUMNS": "200"}
    env.pop("TUNEFARM_DATABASE_URL", None)  # the default: SQLite in the data directory
    env.pop("TUNEFARM_TOKEN", None)
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen([sys.executable, "-m", "tuner", "up", "--port", str(port)], env=env,
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        token_file = tmp_path / "data" / "token"
        deadline = time.monotonic() + 60
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert token_file.exists(), (tmp_path / "up.log").read_text()
        children = psutil.Process(up.pid).children()
        assert len(children) == 3
        out = subprocess.run([sys.executable, "-m", "tuner", "submit", "matmul", "--shape",
                              "32,32,32", "--trials", "4"], env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr + (tmp_path / "up.log").read_text()
        assert "SUCCEEDED: 4/4 trials" in out.stdout
        up.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.wait(timeout=90) == 0
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
    finally:
        kill_group(up)
        log.close()
