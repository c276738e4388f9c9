"""Engines, URLs, error wrapping and Alembic plumbing for `tuner.db.store.Store`."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from ..core.errors import DatabaseError

if TYPE_CHECKING:
    import sqlite3

UPGRADE_COMMAND = "tunefarm db upgrade"
HERE = Path(__file__).resolve().parent
PG_MIGRATION_LOCK = 0x74756E6566  # pg_advisory_xact_lock key: one migrator at a time
SQLITE_BUSY_MS = 30_000


def normalize_url(url: str) -> str:
    """`postgresql://` / `postgres://` -> `postgresql+psycopg://` (psycopg 3); others unchanged."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def target_key(target_json: str, device_key: str) -> str:
    """The key of a (target, device) pair: sha256(canonical target JSON + "|" + device)[:16]."""
    return hashlib.sha256(f"{target_json}|{device_key}".encode()).hexdigest()[:16]


def canonical_json_text(text: str) -> str:
    """JSON text re-serialized canonically (sorted keys, no spaces): how target JSON is stored.
    (`tuner.workloads.canonical_json` does the same for a Python object.)"""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def make_engine(url: str) -> tuple[Engine, str]:
    """An engine for a normalized URL and its backend name ("sqlite" or "postgresql")."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url), backend
    if backend == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=4, max_overflow=4), backend
    raise DatabaseError(f"unsupported database {safe_url(url)!r}: use sqlite:///PATH "
                        "or postgresql://USER@HOST/DB")


def private_file(path: Path) -> None:
    """`path` (a SQLite database: every user's TVMScript, records and token hashes) readable by
    its owner only: created 0600 if missing (SQLite gives its -wal and -shm files the database
    file's mode), tightened to 0600 if this user owns it. Its directory is created 0700."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        if path.stat().st_uid == os.geteuid() and path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)


def _sqlite_engine(url: str) -> Engine:
    database = make_url(url).database
    memory = not database or database == ":memory:" or database.startswith("file:")
    if memory or database is None:
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        private_file(Path(database).expanduser())
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        dbapi_conn.isolation_level = None  # pysqlite must not BEGIN on its own; see _on_begin
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Take the write lock up front: a deferred transaction that reads and then writes fails
        # with SQLITE_BUSY (no busy wait) when another process wrote in between.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def alembic_config(url: str | None = None) -> Config:
    """The packaged Alembic config; independent of the working directory."""
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str | None:
    return script_directory().get_current_head()


def known_revisions() -> frozenset[str]:
    return frozenset(r.revision for r in script_directory().walk_revisions())


def wrap_error(exc: SQLAlchemyError, where: str) -> DatabaseError:
    orig = getattr(exc, "orig", None)
    detail = (str(orig) if orig is not None else str(exc)).strip().splitlines()
    msg = detail[0] if detail else type(exc).__name__
    return DatabaseError(f"database error on {where} ({type(exc).__name__}): {msg}")
