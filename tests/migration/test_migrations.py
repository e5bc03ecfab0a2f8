"""Each service's Alembic history builds exactly the schema its tables describe, and can
go down and up again."""

from __future__ import annotations

import asyncio
import importlib

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

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
