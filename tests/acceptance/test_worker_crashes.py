"""A worker killed with SIGKILL at each point of an attempt, as real processes: the API
beside media and Envoy, a worker that dies where the stub's crash point says, then a
second worker that finds the expired lease. Whatever the point, the job ends where
DESIGN.md says, the provider saw the submits it allows, and the user is charged at most
once."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.creation.providers.stub import read_ledger
from services.dev.processes import Child, free_port, spawn
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.stacks import job_in, stack_of_its_own

# Short leases and beats, so a dead worker's job is found within seconds.
ENGINE_ENV = {
    "ATELIER_ENV": "test",
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


def start_worker(api: Stack, name: str, ledger: Path, crash_at: str = "") -> Child:
    env = {
        **ENGINE_ENV,
        "ATELIER_DATABASE_URL": api.database_url,
        "ATELIER_CREATION_PUBLIC_PORT": str(free_port()),
        "ATELIER_CREATION_INTERNAL_PORT": str(free_port()),
        "ATELIER_CREATION_METRICS_PORT": str(free_port()),
        "ATELIER_MEDIA_INTERNAL_ADDRESS": f"127.0.0.1:{api.ports.internal['media']}",
        "ATELIER_STUB_STATE_DIR": str(api.work_dir / "stub"),
        "ATELIER_STUB_LEDGER": str(ledger),
        "ATELIER_STUB_CRASH_AT": crash_at,
    }
    argv = [sys.executable, "-m", "services.creation", "--role", "worker"]
    return spawn(name, argv, env, api.work_dir / "logs")


FINAL = {
    "JOB_STATUS_SUCCEEDED",
    "JOB_STATUS_FAILED",
    "JOB_STATUS_CANCELLED",
    "JOB_STATUS_NEEDS_ATTENTION",
}


async def died(worker: Child, within: float) -> int:
    deadline = time.monotonic() + within
    while worker.alive():
        assert time.monotonic() < deadline, f"{worker.name} did not reach its crash point"
        await asyncio.sleep(0.05)
    return int(worker.process.returncode)


@pytest.mark.parametrize(
    ("point", "final", "reserved"),
    [
        # Nothing reached the provider: the next worker runs a new attempt.
        ("before_submit", "JOB_STATUS_SUCCEEDED", "0"),
        # The provider has the request, but its id was never stored: the outcome is
        # unknown, so an operator decides; no second submit, the points stay held.
        ("after_submit", "JOB_STATUS_NEEDS_ATTENTION", "5"),
        # The id was stored: the next worker resumes polling it.
        ("polling", "JOB_STATUS_SUCCEEDED", "0"),
        ("after_output", "JOB_STATUS_SUCCEEDED", "0"),
        ("before_complete", "JOB_STATUS_SUCCEEDED", "0"),
    ],
)
async def test_a_worker_killed_at_a_point_loses_nothing_and_charges_once(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path, point: str, final: str, reserved: str
) -> None:
    url = f"http://127.0.0.1:{api.ports.envoy}"
    user = User()
    asset = await put_input(api, user.user_id)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    job_id = submitted.json()["job"]["jobId"]
    ledger = tmp_path / "ledger"

    doomed = start_worker(api, f"worker-crash-{point}", ledger, crash_at=point)
    assert await died(doomed, within=30) == -9  # SIGKILL, as a power cut
    survivor = start_worker(api, f"worker-after-{point}", ledger)
    try:
        job = await job_in(http, url, user.headers, job_id, FINAL, within=40)
    finally:
        assert survivor.stop() == 0

    assert job["status"] == final, job
    assert len(read_ledger(ledger).get(job_id, [])) == 1  # the provider saw one submit
    # 100 welcome points, a price of 5: captured once on success, held for the operator.
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == ("95", reserved)
    if final == "JOB_STATUS_SUCCEEDED":
        assert (await http.get(job["outputUrl"])).status_code == 200
