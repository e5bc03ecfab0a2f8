"""What an engine sends to PostgreSQL, for tests that count round trips."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import create_engine


@dataclass
class Wire:
    """Prepared statements as SQLAlchemy sends them, and the plain commands (BEGIN,
    ROLLBACK, COMMIT, a ping) that asyncpg sends outside them."""

    statements: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def clear(self) -> None:
        self.statements.clear()
        self.commands.clear()


@asynccontextmanager
async def watched_engine(url: str) -> AsyncIterator[tuple[AsyncEngine, Wire]]:
    """The kit's engine (as the services build it) with everything it sends recorded."""
    engine = create_engine(url)
    wire = Wire()

    def log_commands(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(
            lambda record: wire.commands.append(record.query.strip().rstrip(";"))
        )

    def log_statement(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        wire.statements.append(statement)

    event.listen(engine.sync_engine, "connect", log_commands)
    event.listen(engine.sync_engine, "before_cursor_execute", log_statement)
    try:
        yield engine, wire
    finally:
        await engine.dispose()
