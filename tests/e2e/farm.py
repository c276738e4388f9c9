"""A whole tunefarm deployment as real processes on loopback: the API (`tunefarm serve`), tuner
processes and worker processes, on a private redis-server and the test's PostgreSQL database.
Every process runs in its own process group and is killed with it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.client import wait_ready
from tests.conftest import _reset_pg, kill_group
from tests.support.targets import RUN_X86
from tuner.db import Store
from tuner.db.tokens import create_token

TARGET = RUN_X86


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Farm:
    def __init__(self, *, db_url: str, redis_url: str, workdir: Path, **env: str) -> None:
        self.db_url, self.redis_url, self.workdir = db_url, redis_url, workdir
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        store = Store(db_url)
        self.user_token = create_token(store, "user", "e2e")
        self.worker_token = create_token(store, "worker", "e2e")
        self.admin_token = create_token(store, "admin", "e2e")
        store.close()
        self.env = {**os.environ, "TUNEFARM_DATABASE_URL": db_url, "TUNEFARM_REDIS_URL": redis_url,
                    "TUNEFARM_REDIS_PREFIX": "e2e:", "TUNEFARM_API_URL": self.api_url,
                    "TUNEFARM_DATA_DIR": str(workdir / "data"), "TUNEFARM_MIN_REPEAT_MS": "2",
                    "TUNEFARM_REPEATS": "3", "TUNEFARM_HEARTBEAT_S": "1", **env}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "tuner", *args], env={**self.env, **env},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
        log.close()
        self.procs[name] = proc
        return proc

    def start_api(self) -> None:
        self.start("api", "serve", "--host", "127.0.0.1", "--port", str(self.port))
        api = self.procs["api"]
        if not wait_ready(self.api_url, alive=lambda: api.poll() is None):
            raise RuntimeError(f"the API did not become ready in 60 s: {self.log('api')}")

    def start_tuner(self, name: str = "tuner", **env: str) -> subprocess.Popen[bytes]:
        return self.start(name, "tuner", **env)

    def start_worker(self, name: str, *args: str, device_key: str = "e2e",
                     target: dict[str, Any] | None = None, **env: str) -> subprocess.Popen[bytes]:
        return self.start(name, "worker", "--device-key", device_key, "--target",
                          json.dumps(target or TARGET), "--name", name, *args,
                          TUNEFARM_TOKEN=self.worker_token, **env)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{self.log(n)}" for n in self.procs)

    def kill(self, name: str, sig: int | None = None) -> None:
        kill_group(self.procs.pop(name), sig)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def client(self, token: str | None = None) -> Any:
        from api.client import Client

        return Client(self.api_url, token or self.user_token, timeout=30)


@contextmanager
def running_farm(pg_url: str, redis_url: str, workdir: Path, **env: str) -> Iterator[Farm]:
    """A farm on a reset database with its API up; every process it started is stopped after."""
    _reset_pg(pg_url)
    f = Farm(db_url=pg_url, redis_url=redis_url, workdir=workdir, **env)
    try:
        f.start_api()
        yield f
    finally:
        f.stop()
