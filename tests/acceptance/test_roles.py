"""`atelier serve creation --role ...`: which listeners and components each role runs."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.cli import main as atelier
from services.creation.app import build
from services.creation.settings import CreationSettings
from services.dev.postgres import connect_kwargs
from services.dev.processes import free_port, grpc_serving, spawn, venv_binary, wait_until
from services.kit.db import asyncpg_url
from tests.support.databases import migrated_database


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


async def _enable_a_model_of(provider_code: str, database_url: str) -> None:
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO creation.models (model_id, display_name, media_kind,"
                    " price_points, provider_code, provider_model)"
                    " VALUES (:code || '-one', 'Acme', 'image', 5, :code, :code || '-v1')"
                ),
                {"code": provider_code},
            )
    finally:
        await engine.dispose()


def _backends_named(database_url: str, name: str) -> bool:
    """Whether a backend of ``database_url``'s database carries application name ``name``."""

    async def count() -> int:
        connection = await asyncpg.connect(**connect_kwargs(database_url))
        try:
            found = await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = $1",
                name,
            )
            return int(found)
        finally:
            await connection.close()

    return asyncio.run(count()) > 0


@pytest.fixture
def creation_only(postgres_admin_url: str) -> Iterator[str]:
    """A database of its own: a worker started here must not take other tests' jobs."""
    with migrated_database(postgres_admin_url, "creation") as url:
        yield url


def worker_env(database_url: str, public: int, internal: int) -> dict[str, str]:
    return {
        "ATELIER_ENV": "test",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_CREATION_PUBLIC_PORT": str(public),
        "ATELIER_CREATION_INTERNAL_PORT": str(internal),
        "ATELIER_CREATION_METRICS_PORT": str(free_port()),
    }


def test_a_worker_process_listens_only_internally(creation_only: str, tmp_path: Path) -> None:
    public, internal = free_port(), free_port()
    env = worker_env(creation_only, public, internal)
    child = spawn(
        "creation-worker",
        [venv_binary("atelier"), "serve", "creation", "--role", "worker"],
        env,
        tmp_path,
    )
    try:
        # Probes reach it on the internal listener; nothing listens on the public port.
        wait_until(child, grpc_serving(f"127.0.0.1:{internal}"), 60)
        assert _refused(public)
        # Its database connections say which role they serve (pg_stat_activity).
        wait_until(child, lambda: _backends_named(creation_only, "atelier-creation-worker"), 30)
    finally:
        assert child.stop() == 0


def test_a_worker_refuses_a_catalog_it_has_no_provider_for(creation_only: str) -> None:
    asyncio.run(_enable_a_model_of("acme", creation_only))
    result = subprocess.run(
        [venv_binary("atelier"), "serve", "creation", "--role", "worker"],
        env={**os.environ, **worker_env(creation_only, free_port(), free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "acme-one" in result.stderr and "'acme'" in result.stderr
    assert "Traceback" not in result.stderr


def test_roles_split_rpcs_from_components() -> None:
    settings = CreationSettings.from_env({})
    api = build(settings, "api")
    worker = build(settings, "worker")
    everything = build(settings, "all")
    assert api.serve_public and api.public and api.internal
    assert [c.name for c in api.components] == ["outbox-relay", "webhook-deliverer", "job-waits"]
    assert not worker.serve_public and not worker.public and not worker.internal
    assert [c.name for c in worker.components] == [
        c.name for c in everything.components if c.name != "job-waits"
    ]
    assert everything.public and everything.internal


def test_role_is_for_creation_only() -> None:
    assert atelier(["serve", "media", "--role", "worker"]) == 2
