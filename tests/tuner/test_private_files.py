"""The data directory and the SQLite database hold every user's TVMScript, records and token
hashes: the directory is 0700, the database (and its -wal/-shm files) and token files 0600, so
a sandbox child running as another user cannot read them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy import text

from tuner.cli.tokens import _write_secret
from tuner.core.config import Settings
from tuner.db.store import Store


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_new_database_and_its_directory_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: files 0644, directories 0755 by default
    try:
        db = tmp_path / "data" / "tunefarm.db"
        store = Store(f"sqlite:///{db}")
        with store.session() as s:
            s.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            s.execute(text("INSERT INTO t VALUES (1)"))
        assert _mode(db.parent) == 0o700 and _mode(db) == 0o600
        for extra in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            if extra.exists():
                assert _mode(extra) == 0o600, extra
    finally:
        os.umask(old)


def test_an_existing_readable_database_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.touch()
    os.chmod(db, 0o644)
    Store(f"sqlite:///{db}")
    assert _mode(db) == 0o600


def test_the_data_directory_and_token_files_are_private(tmp_path: Path) -> None:
    data = tmp_path / "share" / "tunefarm"
    url = Settings(data_dir=data).resolved_database_url()
    assert url.endswith("tunefarm.db") and _mode(data) == 0o700
    os.chmod(data, 0o755)
    Settings(data_dir=data).resolved_database_url()
    assert _mode(data) == 0o700  # tightened again
    token = tmp_path / "other" / "token"
    _write_secret(token, "secret\n")
    assert _mode(token) == 0o600 and _mode(token.parent) == 0o700
