"""Alembic environment: the models' metadata, ``compare_type=True``, and the URL from
``STAGEWRIGHT_DATABASE_URL`` (or a connection handed over by ``api.core.db.migrate``)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from api.core.config import Settings
from api.core.db import Database, migration_connection
from api.store.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    # Only for the `alembic` command line; a server migrating itself keeps its logging.
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_offline() -> None:
    context.configure(
        url=Settings.from_env().database_url,
        target_metadata=target_metadata,
        compare_type=True,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    database = Database(Settings.from_env().database_url)
    try:
        with migration_connection(database) as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        database.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
