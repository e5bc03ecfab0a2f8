"""What an engine sends to PostgreSQL, for tests that count round trips."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import create_engine


@dataclass
class Wire:
    """Statements as the services send them (SQLAlchemy's, and those run on asyncpg
    directly by kit.db's driver helpers), and the transaction commands (BEGIN, ROLLBACK,
    COMMIT) and pings sent outside them."""

    statements: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def clear(self) -> None:
        self.statements.clear()
        self.commands.clear()

    async def caught_up(self) -> Wire:
        """asyncpg hands each query to its loggers with loop.call_soon, after the query
        returns: one turn of the loop runs those callbacks (they were scheduled before
        this task's own wake-up), so everything sent so far is recorded."""
        await asyncio.sleep(0)
        return self


@asynccontextmanager
async def watched_engine(url: str) -> AsyncIterator[tuple[AsyncEngine, Wire]]:
    """The kit's engine (as the services build it) with everything it sends recorded."""
    engine = create_engine(url)
    wire = Wire()

    def log_driver_query(record: Any) -> None:
        # asyncpg logs what is sent through its own API: SQLAlchemy's transaction commands
        # and pings, and every statement the driver helpers run (SQLAlchemy's own
        # statements go through prepared statements, which it does not log).
        query = record.query.strip().rstrip(";")
        first = query.split(maxsplit=1)[0].upper() if query else ""
        if first in ("", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
            wire.commands.append(query)
        else:
            wire.statements.append(query)

    def log_commands(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log_driver_query)

    def log_statement(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        wire.statements.append(statement)

    event.listen(engine.sync_engine, "connect", log_commands)
    event.listen(engine.sync_engine, "before_cursor_execute", log_statement)
    try:
        yield engine, wire
    finally:
        await engine.dispose()
