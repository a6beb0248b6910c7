"""Alembic environment. Runs against the connection the orchestrator hands it
(``config.attributes["connection"]``) or, for the alembic CLI, against ``sqlalchemy.url``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from orchestrator.store.models import Base

VERSION_TABLE = "orchestrator_alembic_version"  # our own, so the DB can sit beside MLflow/Optuna

config = context.config
target_metadata = Base.metadata


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():  # pragma: no cover
    raise SystemExit("offline migrations are not supported; run `orchestrator db upgrade`")
run_migrations_online()
