"""The async SQLAlchemy engine over asyncpg, shared by every service's store.

Every wait has a deadline (:class:`DatabaseSettings`): connecting, checking a connection
out of the pool, each statement and each lock wait. PostgreSQL enforces statement_timeout
and lock_timeout itself; asyncpg's command_timeout is the client-side backstop for a
server that cannot answer at all (stopped with SIGSTOP, a dead network path).

The pool holds a fixed number of connections (no overflow: connections opened and closed
per burst would each prepare their statements again) and never pings on checkout (a ping
is three messages per checkout). A connection the server closed is noticed by asyncpg
when the socket closes and discarded at checkout, for free; a read that still lands on a
dead connection is run once more on a fresh one.

The hottest statements skip SQLAlchemy's per-statement work and run on the pooled asyncpg
connection itself (:func:`driver_connection`, :func:`driver_fetch`): same pool, same
checkout deadline and server-side timeouts, and asyncpg prepares each statement text once
per connection (its statement cache) so a hot statement is one Bind/Execute/Sync.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import ClauseElement, Executable, Row, event, text
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

from services.kit.settings import DatabaseSettings

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


def _milliseconds(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


# Past the server's own statement_timeout, so a live server cancels first (a clean
# QueryCanceled, the connection stays usable) and the client only gives up on a mute one.
CLIENT_TIMEOUT_MARGIN_SECONDS = 0.25


def create_engine(
    url: str,
    *,
    application_name: str = "atelier",
    limits: DatabaseSettings | None = None,
) -> AsyncEngine:
    limits = limits or DatabaseSettings()
    engine = create_async_engine(
        asyncpg_url(url),
        pool_size=limits.pool_size,
        max_overflow=0,
        pool_timeout=limits.pool_timeout_seconds,
        pool_pre_ping=False,
        connect_args={
            "timeout": limits.connect_timeout_seconds,
            "command_timeout": limits.statement_timeout_seconds + CLIENT_TIMEOUT_MARGIN_SECONDS,
            "server_settings": {
                "application_name": application_name,
                "statement_timeout": _milliseconds(limits.statement_timeout_seconds),
                "lock_timeout": _milliseconds(limits.lock_timeout_seconds),
            },
        },
    )
    event.listen(engine.sync_engine, "checkout", _discard_if_closed)
    event.listen(engine.sync_engine, "invalidate", _drop_at_once)
    return engine


def _drop_at_once(dbapi_connection: Any, record: Any, error: BaseException | None) -> None:
    """Pool invalidate hook: a connection given up on (a statement cancelled by the call's
    deadline, a dropped socket) is closed at once. SQLAlchemy would first try a graceful
    close, which waits up to 2 s for a server that may be frozen, and the call's answer
    with it."""
    dbapi_connection.driver_connection.terminate()


def _discard_if_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Pool checkout hook: a connection whose socket the server closed (a restart, an
    idle timeout, pg_terminate_backend) is replaced before anyone uses it."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this connection")


async def database_answers(engine: AsyncEngine) -> bool:
    """Readiness probe: one round trip."""
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
    return True


class Database:
    """A service's engine with the hooks the server bootstrap wants."""

    def __init__(
        self, url: str, application_name: str, limits: DatabaseSettings | None = None
    ) -> None:
        self.engine = create_engine(url, application_name=application_name, limits=limits)

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


T = TypeVar("T")


async def read(engine: AsyncEngine, run: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Runs ``run`` on a :func:`reading` connection. If the server had dropped that
    connection, it runs once more on a fresh one: a read, or a statement that is
    idempotent on its own, is safe to send twice."""
    try:
        async with reading(engine) as connection:
            return await run(connection)
    except DBAPIError as error:
        if not error.connection_invalidated:
            raise
    async with reading(engine) as connection:
        return await run(connection)


async def fetch(
    engine: AsyncEngine, statement: Executable, parameters: Mapping[str, Any] | None = None
) -> Sequence[Row[Any]]:
    """The rows of one read statement, in one round trip (see :func:`read`)."""

    async def run(connection: AsyncConnection) -> Sequence[Row[Any]]:
        return (await connection.execute(statement, parameters)).all()

    return await read(engine, run)


# -- the hot path: asyncpg on the pool's own connections ------------------------------------

_DRIVER_DIALECT = PGDialect_asyncpg(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class DriverStatement:
    """A SQLAlchemy statement compiled once into asyncpg's SQL (``$1``, ``$2``, ...), so
    the tables stay the one definition of names. Values are passed as asyncpg takes them
    (no SQLAlchemy type processing: JSON goes in as text)."""

    sql: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, statement: ClauseElement) -> DriverStatement:
        compiled = statement.compile(dialect=_DRIVER_DIALECT)
        assert isinstance(compiled, SQLCompiler)  # a positional paramstyle: names in order
        return cls(str(compiled), tuple(compiled.positiontup or ()))

    def args(self, **values: Any) -> list[Any]:
        return [values[name] for name in self.names]


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[Any]:
    """The asyncpg connection of a connection checked out of ``engine``'s pool (its
    checkout deadline and hooks apply), for statements run in autocommit mode. A failure
    that is not the server's answer to a statement (a dropped socket, a client timeout)
    may have left the connection unusable: it is discarded, not put back."""
    pooled = await engine.raw_connection()
    connection: Any = pooled.driver_connection
    try:
        yield connection
    except BaseException as error:
        if not isinstance(error, asyncpg.PostgresError) or connection.is_closed():
            # Outside a greenlet SQLAlchemy terminates at once (no graceful close to wait on).
            pooled.invalidate(error)
        raise
    finally:
        # Checking in is synchronous SQLAlchemy code (it may reset the connection).
        await greenlet_spawn(pooled.close)


def _dropped(error: BaseException, connection: Any) -> bool:
    """The server or the network closed the connection under the statement. Not a client
    timeout: a server that does not answer would be waited for twice."""
    return not isinstance(error, TimeoutError) and bool(connection.is_closed())


async def driver_fetch(engine: AsyncEngine, statement: DriverStatement, **values: Any) -> list[Any]:
    """The rows (asyncpg Records) of one read statement in one round trip; run once more
    on a fresh connection if the server had dropped the first one (see :func:`read`)."""
    args = statement.args(**values)
    used: Any = None
    try:
        async with driver_connection(engine) as connection:
            used = connection
            return list(await connection.fetch(statement.sql, *args))
    except Exception as error:
        if used is None or not _dropped(error, used):
            raise
    async with driver_connection(engine) as connection:
        return list(await connection.fetch(statement.sql, *args))
