"""Connecting to PostgreSQL from a command (``atelier migrate``): a failure is one line an
operator can act on, naming the server and the database, never the password. Services
answer the same failures with UNAVAILABLE instead (services/kit/outages.py).

Every way a connection can fail ends up here: a host that does not resolve, a port where
nothing listens, a server that does not answer in time, a refused login, a database that
does not exist. A missing database is not created: the URL may carry a typo, and creating
it would leave the services running against an empty database; the line says how to
create it instead.
"""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# What a connection attempt raises: the socket's errors, the client's timeout, the
# server's refusals (asyncpg's, or SQLAlchemy's wrapping of them).
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    DBAPIError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)


class ConnectFailed(Exception):
    """No connection to PostgreSQL could be made; the message is the one line to show."""


@dataclass(frozen=True)
class Server:
    """Where a database URL points, as an operator would type it again."""

    host: str | None
    port: int
    user: str | None
    database: str | None
    password: str | None

    @classmethod
    def of(cls, url: str) -> Server:
        parsed = make_url(url)
        host = parsed.query.get("host") or parsed.host
        return cls(
            host=host if isinstance(host, str) or host is None else host[0],
            port=parsed.port or 5432,
            user=parsed.username,
            # Without one, PostgreSQL takes the user's name as the database's.
            database=parsed.database or parsed.username,
            password=parsed.password if isinstance(parsed.password, str) else None,
        )

    def __str__(self) -> str:
        where = f"{self.host}:{self.port}" if self.host else f"the default socket, port {self.port}"
        return f"PostgreSQL at {where}"

    def createdb(self, database: str) -> str:
        command = ["createdb"]
        if self.host:
            command += ["-h", self.host]
        command += ["-p", str(self.port)]
        if self.user:
            command += ["-U", self.user]
        return shlex.join([*command, database])


def _root(error: BaseException) -> BaseException:
    """The driver's or the socket's own error under SQLAlchemy's wrappings."""
    seen = {id(error)}
    current = error
    while not isinstance(current, asyncpg.PostgresError | OSError | TimeoutError):
        orig = getattr(current, "orig", None)
        inner = orig if isinstance(orig, BaseException) else current.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        current = inner
    return current


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _detail(error: BaseException, server: Server) -> str:
    """The error's own words on one line, the password blotted out should they hold it."""
    words = " ".join(str(error).split())
    return words.replace(server.password, "***") if server.password else words


def explain(error: BaseException, url: str, timeout_seconds: float) -> str:
    """One line: what failed, where, and what to do about it."""
    server = Server.of(url)
    root = _root(error)
    detail = _detail(root, server)
    if isinstance(root, asyncpg.exceptions.InvalidCatalogNameError) and server.database:
        return (
            f"database {_quoted(server.database)} does not exist on {server}; create it "
            f"first: {server.createdb(server.database)} "
            f"(or in psql: CREATE DATABASE {_quoted(server.database)};)"
        )
    if isinstance(
        root,
        asyncpg.exceptions.InvalidPasswordError
        | asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    ):
        return f"{server} refused the login: {detail} (check the user and password in the URL)"
    if isinstance(root, asyncpg.PostgresError):
        return f"{server} refused the connection: {detail}"
    if isinstance(root, TimeoutError):
        return (
            f"{server} did not answer within {timeout_seconds:g} s "
            "(is it reachable from here? ATELIER_DB_CONNECT_TIMEOUT sets the wait)"
        )
    if isinstance(root, socket.gaierror):
        return f"cannot resolve the database host {server.host!r}: {root.strerror}"
    if isinstance(root, ConnectionRefusedError):
        return f"{server} refused the connection: nothing listens there (is PostgreSQL running?)"
    if isinstance(root, OSError) and root.strerror:
        return f"cannot connect to {server}: {root.strerror}"
    return f"cannot connect to {server}: {type(root).__name__}: {detail}"


async def connect(engine: AsyncEngine, url: str, timeout_seconds: float) -> AsyncConnection:
    """A connection from ``engine`` (whose URL is ``url``), or ConnectFailed saying why not."""
    try:
        return await engine.connect()
    except CONNECT_ERRORS as error:
        raise ConnectFailed(explain(error, url, timeout_seconds)) from error
