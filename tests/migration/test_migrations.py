"""Each service's Alembic history builds exactly the schema its tables describe, and can
go down and up again."""

from __future__ import annotations

import asyncio
import importlib
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from services.dev import postgres
from services.kit import migrations
from services.kit.db import asyncpg_url

SERVICES = ("creation", "media", "notify")
USER_TABLES = """
    SELECT tablename FROM pg_tables WHERE schemaname = :s AND tablename <> 'alembic_version'
"""


def tables_of(service: str) -> tuple[str, MetaData]:
    module = importlib.import_module(f"services.{service}.tables")
    return module.SCHEMA, module.metadata


def run(url: str, work: object) -> object:
    async def go() -> object:
        engine = create_async_engine(asyncpg_url(url), poolclass=pool.NullPool)
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(work)  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def differences(url: str, service: str) -> list[object]:
    schema, metadata = tables_of(service)

    def compare(connection: Connection) -> list[object]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, _p: type_ != "schema" or name == schema,
                "version_table_schema": schema,
            },
        )
        return list(compare_metadata(context, metadata))

    return run(url, compare)  # type: ignore[return-value]


@pytest.mark.parametrize("service", SERVICES)
def test_migrations_build_the_declared_schema(scratch_database: str, service: str) -> None:
    migrations.upgrade(service, scratch_database)
    assert differences(scratch_database, service) == []


@pytest.mark.parametrize("service", SERVICES)
def test_downgrade_then_upgrade_round_trip(scratch_database: str, service: str) -> None:
    migrations.upgrade(service, scratch_database)
    migrations.downgrade(service, scratch_database, "base")
    schema, _ = tables_of(service)

    def user_tables(connection: Connection) -> list[str]:
        rows = connection.execute(
            text(USER_TABLES),
            {"s": schema},
        )
        return [row[0] for row in rows]

    assert run(scratch_database, user_tables) == []
    migrations.upgrade(service, scratch_database)
    assert differences(scratch_database, service) == []


def test_histories_do_not_collide(scratch_database: str) -> None:
    for service in SERVICES:
        migrations.upgrade(service, scratch_database)

    def versions(connection: Connection) -> dict[str, str]:
        return {
            schema: connection.execute(
                text(f'SELECT version_num FROM "{schema}".alembic_version')
            ).scalar_one()
            for schema in SERVICES
        }

    found = run(scratch_database, versions)
    assert isinstance(found, dict)
    assert set(found) == set(SERVICES)


def test_upgrading_twice_changes_nothing(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.upgrade("creation", scratch_database)

    def count(connection: Connection) -> int:
        return int(connection.execute(text("SELECT count(*) FROM creation.models")).scalar_one())

    assert run(scratch_database, count) == 4


CONSTRAINTS = """
    SELECT c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
    FROM pg_constraint k
    JOIN pg_class c ON c.oid = k.conrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :s AND c.relname <> 'alembic_version'
"""
INDEXES = """
    SELECT indexname, indexdef FROM pg_indexes
    WHERE schemaname = :s AND tablename <> 'alembic_version'
"""


def catalog_of(url: str, schema: str) -> set[tuple[str, str]]:
    def read(connection: Connection) -> set[tuple[str, str]]:
        found: set[tuple[str, str]] = set()
        for query in (CONSTRAINTS, INDEXES):
            found |= {(row[0], row[1]) for row in connection.execute(text(query), {"s": schema})}
        return found

    return run(url, read)  # type: ignore[return-value]


@pytest.mark.parametrize("service", SERVICES)
def test_constraint_and_index_names_and_definitions_match_the_tables(
    scratch_database: str, postgres_admin_url: str, service: str
) -> None:
    """Alembic's comparison skips CHECK constraints and index details: compare PostgreSQL's
    own catalog of a migrated database with one built straight from the tables."""
    migrations.upgrade(service, scratch_database)
    schema, metadata = tables_of(service)
    name = f"atelier_declared_{uuid.uuid4().hex[:10]}"
    declared = postgres.ensure_database(postgres_admin_url, name)
    try:

        def create(connection: Connection) -> None:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
            metadata.create_all(connection)
            connection.commit()

        run(declared, create)
        assert catalog_of(scratch_database, schema) == catalog_of(declared, schema)
    finally:
        postgres.drop_database(postgres_admin_url, name)
