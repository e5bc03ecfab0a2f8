"""Alembic, one history per service schema.

Each service keeps its revisions in ``services/<name>/migrations/versions`` and its version
table inside its own schema, so histories never collide. Migrating takes an advisory lock:
replicas that start together migrate one at a time. A database that cannot be reached is
one line saying why (services/kit/db_connect.py), not a stack trace.
"""

from __future__ import annotations

import asyncio
import zlib

from alembic import command, context
from alembic.config import Config
from sqlalchemy import MetaData, pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from services.kit.db import asyncpg_url
from services.kit.db_connect import connect

# asyncpg's own default: callers that know better (`atelier migrate`) pass their setting.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 60.0


def alembic_config(
    service: str,
    database_url: str,
    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
) -> Config:
    config = Config()
    config.set_main_option("script_location", f"services.{service}:migrations")
    config.attributes["database_url"] = database_url
    config.attributes["connect_timeout_seconds"] = connect_timeout_seconds
    return config


def upgrade(
    service: str,
    database_url: str,
    revision: str = "head",
    *,
    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
) -> None:
    """Migrates a service's schema. Call it where no event loop runs (it starts one).
    Raises ConnectFailed, with its one-line reason, when the database cannot be reached."""
    command.upgrade(alembic_config(service, database_url, connect_timeout_seconds), revision)


def downgrade(service: str, database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(service, database_url), revision)


def _lock_key(schema: str) -> int:
    return zlib.crc32(f"atelier-migrate-{schema}".encode())


def run_env(schema: str, metadata: MetaData) -> None:
    """The body of every service's ``env.py``: online migrations of one schema."""
    url = context.config.attributes["database_url"]
    timeout = context.config.attributes.get(
        "connect_timeout_seconds", DEFAULT_CONNECT_TIMEOUT_SECONDS
    )

    def migrate(connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _lock_key(schema)})
        try:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            connection.commit()
            context.configure(
                connection=connection,
                target_metadata=metadata,
                version_table_schema=schema,
                include_schemas=True,
                include_name=lambda name, type_, _parent: type_ != "schema" or name == schema,
            )
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _lock_key(schema)})
            connection.commit()

    async def run() -> None:
        engine = create_async_engine(
            asyncpg_url(url), poolclass=pool.NullPool, connect_args={"timeout": timeout}
        )
        try:
            connection = await connect(engine, url, timeout)
            try:
                await connection.run_sync(migrate)
            finally:
                await connection.close()
        finally:
            await engine.dispose()

    asyncio.run(run())
