"""An in-process worker killed with SIGKILL at each point of an attempt, as real
processes: the API beside media and Envoy, a worker that dies where the stub's crash
point says, then a second worker that finds the expired lease. The matrix and what it
asserts are tests/support/crash_matrix.py's (remote workers answer to it too)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.dev.stack import Stack
from tests.support.crash_matrix import (
    KILL_POINTS,
    LANDED_POINTS,
    StartWorker,
    cancelled_after_landed_outputs,
    killed_at_a_point,
)
from tests.support.stacks import stack_of_its_own
from tests.support.workers import WorkerProcess, start_worker

# Short leases and beats, so a dead worker's job is found within seconds.
ENGINE_ENV = {
    "ATELIER_STUB_DURATION": "1",
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_WORKER_POLL": "0.5",
}


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API alone (jobs wait for the workers each test starts), on its own database."""
    work = tmp_path_factory.mktemp("crashes")
    with stack_of_its_own(postgres_admin_url, work, "api", {"ATELIER_ENV": "test"}) as stack:
        yield stack


def in_process(api: Stack, ledger: Path) -> StartWorker:
    def start(name: str, crash_at: str) -> WorkerProcess:
        env = {**ENGINE_ENV, "ATELIER_STUB_LEDGER": str(ledger), "ATELIER_STUB_CRASH_AT": crash_at}
        return start_worker(api, f"worker-{name}", env)

    return start


@pytest.mark.parametrize(("point", "final", "reserved"), KILL_POINTS)
async def test_a_worker_killed_at_a_point_loses_nothing_and_charges_once(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path, point: str, final: str, reserved: str
) -> None:
    ledger = tmp_path / "ledger"
    await killed_at_a_point(api, http, ledger, in_process(api, ledger), point, final, reserved)


@pytest.mark.parametrize("point", LANDED_POINTS)
async def test_a_job_cancelled_after_its_dead_worker_landed_outputs_keeps_none(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path, point: str
) -> None:
    await cancelled_after_landed_outputs(api, http, in_process(api, tmp_path / "ledger"), point)
