"""`atelier migrate` against a PostgreSQL it cannot use, as an operator meets it: each way
of failing to connect is one line that names the server (and the database), a non-zero
exit, no stack trace and no password. A missing database is not created; the line says
how, and doing what it says is enough."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy.engine import make_url

from services.dev import postgres
from services.dev.processes import free_port
from tests.support.cli import atelier, dev_ports
from tests.support.pg_outage import OwnPostgres

PASSWORD = "right-horse-battery-staple"


def only_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line the command printed, after checking that it failed without a trace."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def migrate(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return atelier("migrate", "all", env={"ATELIER_DATABASE_URL": url, **env}, timeout=60)


@pytest.fixture
def absent_database(postgres_admin_url: str) -> Iterator[str]:
    name = f"atelier_absent_{uuid.uuid4().hex[:12]}"
    yield name
    postgres.drop_database(postgres_admin_url, name)


async def _exists(admin_url: str, database: str) -> bool:
    connection = await asyncpg.connect(**postgres.connect_kwargs(admin_url))
    try:
        found = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        return bool(found)
    finally:
        await connection.close()


async def _execute(admin_url: str, sql: str) -> None:
    connection = await asyncpg.connect(**postgres.connect_kwargs(admin_url))
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def test_a_missing_database_is_one_line_saying_how_to_create_it(
    postgres_admin_url: str, absent_database: str
) -> None:
    url = postgres.with_database(postgres_admin_url, absent_database)
    line = only_line(migrate(url))
    assert line.startswith(f'atelier migrate: database "{absent_database}" does not exist on ')
    server = postgres.connect_kwargs(url)
    createdb = f"createdb -h {server['host']} -p {server['port']} -U {server['user']}"
    assert f"create it first: {createdb} {absent_database} " in line
    # Not created behind the operator's back: a typo in the URL stays a typo.
    assert not asyncio.run(_exists(postgres_admin_url, absent_database))
    # What the line says to do is all it takes.
    [sql] = re.findall(r"CREATE DATABASE \"[^\"]+\";", line)
    asyncio.run(_execute(postgres_admin_url, sql))
    done = migrate(url)
    assert done.returncode == 0, done.stderr


def test_a_port_where_nothing_listens_is_one_line() -> None:
    port = free_port()
    line = only_line(migrate(f"postgresql://postgres@127.0.0.1:{port}/atelier"))
    assert f"PostgreSQL at 127.0.0.1:{port} refused the connection" in line


def test_a_host_that_does_not_resolve_is_one_line() -> None:
    line = only_line(migrate("postgresql://postgres@db.invalid:5432/atelier"))
    assert "cannot resolve the database host 'db.invalid'" in line


def test_a_server_that_never_answers_is_one_line_after_the_connect_timeout() -> None:
    # The kernel completes the handshake; nobody ever reads the startup message.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        line = only_line(
            migrate(
                f"postgresql://postgres@127.0.0.1:{port}/atelier", ATELIER_DB_CONNECT_TIMEOUT="1"
            )
        )
    assert f"PostgreSQL at 127.0.0.1:{port} did not answer within 1 s" in line


@pytest.fixture(scope="module")
def password_postgres() -> Iterator[str]:
    """A PostgreSQL of this test's own that asks for a password (the shared one trusts)."""
    server = OwnPostgres()
    try:

        async def set_password() -> str:
            connection = await asyncpg.connect(**postgres.connect_kwargs(server.admin_url))
            try:
                await connection.execute(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
                return str(await connection.fetchval("SHOW hba_file"))
            finally:
                await connection.close()

        hba = Path(asyncio.run(set_password()))
        hba.write_text("local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n")
        # A restart reads the new rules before it accepts anyone (a reload would race).
        server.stop()
        server.start()
        yield server.admin_url
    finally:
        server.close()


def test_a_wrong_password_is_one_line_that_never_shows_it(password_postgres: str) -> None:
    wrong = "wrong-" + PASSWORD
    url = make_url(password_postgres).set(password=wrong).render_as_string(hide_password=False)
    result = migrate(url)
    line = only_line(result)
    assert 'refused the login: password authentication failed for user "postgres"' in line
    assert wrong not in result.stderr


def test_atelier_dev_on_a_missing_database_is_one_line_too(
    postgres_admin_url: str, absent_database: str, tmp_path: Path
) -> None:
    url = postgres.with_database(postgres_admin_url, absent_database)
    env = {f"ATELIER_{k}": v for k, v in dev_ports().items()}
    env.update({"ATELIER_DEV_DIR": str(tmp_path / "var"), "ATELIER_DATABASE_URL": url})
    result = atelier("dev", env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f'atelier dev: not started, database "{absent_database}" does not exist' in (
        result.stderr
    )
