"""What `atelier migrate` says when it cannot connect: the server as the URL names it
(a socket directory too), the command for a missing database, never the password."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]

from services.kit.db_connect import Server, explain


def test_a_socket_url_names_its_directory_and_the_createdb_command_quotes_names() -> None:
    server = Server.of("postgresql://ops@/my db?host=/run/postgresql")
    assert str(server) == "PostgreSQL at /run/postgresql:5432"
    assert server.createdb("my db") == "createdb -h /run/postgresql -p 5432 -U ops 'my db'"


def test_without_a_database_in_the_url_the_users_name_is_the_database() -> None:
    line = explain(
        asyncpg.exceptions.InvalidCatalogNameError('database "ops" does not exist'),
        "postgresql://ops@db:6432",
        1.5,
    )
    assert line.startswith('database "ops" does not exist on PostgreSQL at db:6432; ')
    assert "createdb -h db -p 6432 -U ops ops" in line


def test_an_unexpected_failure_is_one_line_without_the_password() -> None:
    error = asyncpg.exceptions.InterfaceError("bad\nconnection s3cret-value")
    line = explain(error, "postgresql://u:s3cret-value@db/atelier", 1.5)
    assert line == "cannot connect to PostgreSQL at db:5432: InterfaceError: bad connection ***"
