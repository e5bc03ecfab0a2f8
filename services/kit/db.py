"""The async SQLAlchemy engine over asyncpg, shared by every service's store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

# Constraint and index names every schema uses, so migrations and tables agree on them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def asyncpg_url(url: str) -> str:
    """Accepts the usual ``postgresql://`` / ``postgres://`` spellings and names the driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+asyncpg"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ValueError(f"not a PostgreSQL URL (driver {parsed.drivername!r})")
    return parsed.render_as_string(hide_password=False)


def create_engine(
    url: str, *, pool_size: int = 10, application_name: str = "atelier"
) -> AsyncEngine:
    return create_async_engine(
        asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"server_settings": {"application_name": application_name}},
    )


async def database_answers(engine: AsyncEngine) -> bool:
    """Readiness probe: one round trip."""
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
    return True


class Database:
    """A service's engine with the hooks the server bootstrap wants."""

    def __init__(self, url: str, application_name: str) -> None:
        self.engine = create_engine(url, application_name=application_name)

    async def answers(self) -> bool:
        return await database_answers(self.engine)

    async def close(self) -> None:
        await self.engine.dispose()


@asynccontextmanager
async def reading(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for reads that need no transaction: in autocommit mode, so a lone
    SELECT costs one round trip instead of BEGIN + SELECT + ROLLBACK."""
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        yield connection
