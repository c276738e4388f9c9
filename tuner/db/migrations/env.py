"""Alembic environment of the tunefarm database.

The URL (or an open connection, under `config.attributes["connection"]`) is set programmatically by
`tuner.db.store.Store`; as a fallback the tunefarm settings are used (TUNEFARM_DATABASE_URL).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from tuner.db.tables import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from tuner.core.config import get_settings
    from tuner.db.engine import normalize_url

    return normalize_url(get_settings().resolved_database_url())


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = connection.dialect.name if connection is not None else (url or "").split(":", 1)[0]
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=dialect.startswith("sqlite"),  # SQLite cannot ALTER most things
        compare_type=True,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
