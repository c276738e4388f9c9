"""A real API process for tests: `python -m tuner serve` on a free port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """`python -m tuner serve` on a free port, in its own process group (killed with it)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner", "serve", "--host", "127.0.0.1", "--port",
                 self.url.rsplit(":", 1)[1]], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(ROOT))

    def wait_ready(self) -> None:
        from api.client import wait_ready

        proc = self.proc
        if not wait_ready(self.url, timeout_s=120, alive=lambda: proc.poll() is None):
            pytest.fail(f"API not ready: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)
