"""`make test`'s own PostgreSQL server (scripts/suite_postgres.py): started from the
machine's binaries with room for the suite's connections, answering on loopback, and gone
after stop."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from scripts import suite_postgres
from services.dev import postgres


@pytest.fixture
def directory() -> Iterator[Path]:
    # Under /tmp itself: the server's user must reach it (pytest's own folders are root's).
    made = Path(tempfile.mkdtemp(prefix="atelier-suite-pg-", dir="/tmp"))
    yield made
    suite_postgres.stop(made)
    shutil.rmtree(made, ignore_errors=True)


async def settings(url: str) -> dict[str, str]:
    connection = await asyncpg.connect(**postgres.connect_kwargs(url))
    try:
        rows = await connection.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN ('max_connections', 'fsync')"
        )
    finally:
        await connection.close()
    return {row["name"]: row["setting"] for row in rows}


def test_the_suites_server_starts_with_room_for_its_connections_and_stops(
    directory: Path,
) -> None:
    if suite_postgres.binaries() is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql: make test uses 5432")
    url = suite_postgres.start(directory)
    assert url is not None and url.startswith("postgresql://postgres@127.0.0.1:")
    assert asyncio.run(settings(url)) == {
        "max_connections": str(suite_postgres.MAX_CONNECTIONS),
        # Durable as PostgreSQL ships: what a commit waits for is what tests see.
        "fsync": "on",
    }
    # Started again in the same place: a fresh server, the old one stopped first.
    again = suite_postgres.start(directory)
    assert again is not None and postgres.server_answers(again)

    suite_postgres.stop(directory)
    assert not postgres.server_answers(again, timeout=1.0)
