"""The whole stack as `atelier dev` runs it — three service processes and Envoy — on free
ports against the test session's database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from services.dev.stack import Stack, StackPorts
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from tests.support.stacks import stack_of_its_own


@pytest.fixture(scope="session")
def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("stack")
    # The API alone: jobs stay queued, so tests see each state they cause. The job engine
    # runs in its own stack (test_jobs_run.py).
    running = Stack(
        database_url=database_url,
        ports=StackPorts.free(),
        work_dir=work,
        log_dir=work / "logs",
        creation_role="api",
        console=False,
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def api_of_its_own(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The API alone on a database of its own, for a module that starts its own worker
    processes: its jobs wait for them, and no other stack's worker takes them."""
    work = tmp_path_factory.mktemp("api")
    with stack_of_its_own(postgres_admin_url, work, "api", {"ATELIER_ENV": "test"}) as stack:
        yield stack


@pytest.fixture(scope="session")
def token() -> str:
    return issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "acceptance-user", 3600)


@pytest.fixture(scope="session")
def edge_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.ports.envoy}"


@pytest.fixture(scope="session")
def descriptor() -> Path:
    return Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client
