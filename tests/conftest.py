"""Shared fixtures: real PostgreSQL and Redis services, and a `Store` on each database backend.

Services are expected at their default local addresses. When one is unreachable the tests that
need it are skipped with the reason, except under `CI=true`, where they fail: CI must run them.
Overrides: TUNEFARM_TEST_PG_URL (an admin URL allowed to CREATE DATABASE),
TUNEFARM_TEST_REDIS_URL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# fixtures shared by several folders: `browser` (Chromium via Playwright)
pytest_plugins = ["tests.support.browser"]


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the project's packages once, before the suite starts its processes (in the
    controller, not in each xdist worker). Where PYTHONDONTWRITEBYTECODE is set (CI sets it),
    no process writes a `.pyc`, and every process the tests start (builders, sandboxes, parse
    children, services, CLI runs: hundreds) compiled each module it imports from source again:
    4% of the CPU time of the slowest tests. A `.pyc` already written is read either way."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in ("tuner", "schedules", "api", "workers", "bench"):
        compileall.compile_dir(str(root / package), quiet=1)


def _unavailable(what: str, exc: BaseException, override: str) -> NoReturn:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    msg = f"{what} is not reachable ({reason})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg}; CI=true requires it", pytrace=False)
    pytest.skip(f"{msg}; start it or point {override} at one (under CI=true this fails)")


def _pg_engine(url: str, **kw: Any) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5}, **kw)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database for this test session (dropped at the end)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from tuner.db.engine import normalize_url

    admin_url = normalize_url(os.environ.get("TUNEFARM_TEST_PG_URL") or DEFAULT_PG_URL)
    admin = _pg_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"tunefarm_test_{uuid.uuid4().hex[:12]}"
    failure: BaseException | None = None
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except SQLAlchemyError as exc:
        failure = getattr(exc, "orig", None) or exc
    if failure is not None:
        admin.dispose()
        where = make_url(admin_url).render_as_string(hide_password=True)
        _unavailable(f"PostgreSQL at {where}", failure, "TUNEFARM_TEST_PG_URL")
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name})
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        admin.dispose()


def _reset_pg(url: str) -> None:
    """Drop every tunefarm table and the Alembic version table: the next Store starts at zero."""
    from tuner.db.tables import Base

    engine = _pg_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL lock_timeout = '20s'")  # a leaked connection: fail
            Base.metadata.drop_all(conn)
            conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """An empty database (no schema) on each backend: a SQLite file, or the session's PostgreSQL
    database with all tables dropped."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tunefarm.db'}"
    url: str = request.getfixturevalue("pg_url")
    _reset_pg(url)
    return url


@pytest.fixture
def store(db_url: str) -> Iterator[Any]:
    """A migrated `tuner.db.Store` on `db_url` (closed afterwards)."""
    from tuner.db import Store

    s = Store(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a reachable Redis server (shared: namespace keys with `redis_prefix`)."""
    import redis

    url = os.environ.get("TUNEFARM_TEST_REDIS_URL") or DEFAULT_REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    failure: BaseException | None = None
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        failure = exc
    finally:
        client.close()
    if failure is not None:
        _unavailable(f"Redis at {url}", failure, "TUNEFARM_TEST_REDIS_URL")
    return url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A random key prefix (`tunefarm-test-<hex>:`) for one test; its keys are deleted after."""
    import redis

    prefix = f"tunefarm-test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=3, socket_timeout=3)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def start_private_redis(workdir: Any) -> tuple[Any, str]:
    """A throw-away `redis-server` on a free port in its own process group, for tests that wipe
    Redis (FLUSHALL) or run whole services: never the shared one. Returns (process, url)."""
    import shutil
    import socket
    import subprocess
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        _unavailable("redis-server", FileNotFoundError("not on PATH"), "PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    kill_group(proc)
    pytest.fail("a private redis-server did not start within 10 s")


def kill_group(proc: Any, sig: int | None = None) -> None:
    """Signal a process's whole group (default SIGKILL) and reap it."""
    import signal
    import subprocess

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL if sig is None else sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def private_redis_url(tmp_path: Any) -> Iterator[str]:
    proc, url = start_private_redis(tmp_path)
    try:
        yield url
    finally:
        kill_group(proc)


@pytest.fixture
def r(redis_url: str) -> Iterator[Any]:
    """A decoding client of the shared Redis (use `keys` for the names)."""
    from tuner.queue import streams

    client = streams.connect(redis_url)
    yield client
    client.close()


@pytest.fixture
def keys(redis_prefix: str) -> Any:
    """Key names under this test's random prefix."""
    from tuner.queue import Keys

    return Keys(redis_prefix)


@pytest.fixture
def mark() -> Iterator[Path]:
    """Where a hostile TVMScript payload would leave its marker file (in a world-writable
    directory, so that a payload run by an unprivileged parse child could create it): the file's
    absence means nothing ran."""
    d = tempfile.mkdtemp(prefix="tfmark-", dir="/tmp")
    os.chmod(d, 0o777)
    yield Path(d) / "pwned"
    shutil.rmtree(d, ignore_errors=True)

