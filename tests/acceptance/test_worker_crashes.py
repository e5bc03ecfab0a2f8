"""An in-process worker killed with SIGKILL at each point of an attempt, as real
processes: the API beside media and Envoy, a worker that dies where the stub's crash
point says, then a second worker that finds the expired lease. The matrix and what it
asserts are tests/support/crash_matrix.py's (remote workers answer to it too).

Then the lost submit (killed after the stub accepted, before the request id was stored)
and what follows it: with automatic recovery off, the job waits in NEEDS_ATTENTION through
the reaper's sweeps until an operator inspects it (InspectJob finds the stub's request)
and adopts it; with it on, the reaper adopts it alone. Either way: one submit in all, one
capture, the outputs landed once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc, job_pb2
from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.support.crash_matrix import (
    FINAL,
    KILL_POINTS,
    LANDED_POINTS,
    StartWorker,
    ai_outputs,
    cancelled_after_landed_outputs,
    killed_at_a_point,
    submit,
)
from tests.support.rpc import bearer
from tests.support.scrape import scrape_until
from tests.support.stacks import job_in, stack_of_its_own
from tests.support.workers import WorkerProcess, exited, serving, start_worker

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
        env = {
            **ENGINE_ENV,
            "ATELIER_STUB_LEDGER": str(ledger),
            "ATELIER_STUB_CRASH_AT": crash_at,
            # Recovery off: the matrix's lost submit waits for a person (see below).
            "ATELIER_AUTO_ADOPT": "none",
        }
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


TERMINAL = FINAL - {"JOB_STATUS_NEEDS_ATTENTION"}


async def lost_submit(
    api: Stack, http: httpx.AsyncClient, ledger: Path, auto_adopt: str
) -> tuple[str, dict[str, str], WorkerProcess]:
    """A job whose worker was SIGKILLed after the stub accepted its submit and before
    the request id was stored; a survivor with ATELIER_AUTO_ADOPT=``auto_adopt`` is left
    running its reaper. (job id, the owner's headers, the survivor)."""
    user, job_id = await submit(api, http)
    env = {**ENGINE_ENV, "ATELIER_STUB_LEDGER": str(ledger)}
    doomed = start_worker(api, "lost-submit", {**env, "ATELIER_STUB_CRASH_AT": "after_submit"})
    assert await exited(doomed, within=30) == -9
    assert len(read_ledger(ledger)[job_id]) == 1  # the stub has it; the job does not
    survivor = start_worker(api, f"reaper-{auto_adopt}", {**env, "ATELIER_AUTO_ADOPT": auto_adopt})
    await serving(survivor)
    return job_id, user.headers, survivor


async def finished_once(
    api: Stack, http: httpx.AsyncClient, ledger: Path, job_id: str, headers: dict[str, str]
) -> None:
    """The job SUCCEEDED from its one submit: captured once, every output landed once."""
    url = f"http://127.0.0.1:{api.ports.envoy}"
    # Terminal only: on its way the job is NEEDS_ATTENTION for a moment (the reaper
    # parks it, then adopts it in its own transaction).
    job = await job_in(http, url, headers, job_id, TERMINAL, within=40)
    assert job["status"] == "JOB_STATUS_SUCCEEDED", job
    assert len(read_ledger(ledger)[job_id]) == 1  # one provider submit in all
    balance = (await http.get(f"{url}/v1/balance", headers=headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (90, 0)
    outputs = [output["assetId"] for output in job["outputs"]]
    assert len(outputs) == 2
    owner = job["userId"]
    assert await ai_outputs(api, owner) == dict.fromkeys(outputs, "ready")


async def test_with_recovery_off_a_lost_submit_waits_for_an_operator_who_adopts_it(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    job_id, headers, survivor = await lost_submit(api, http, ledger, "none")
    url = f"http://127.0.0.1:{api.ports.envoy}"
    admin_metadata = bearer(DEV_SERVICE_TOKEN)
    try:
        waiting = await job_in(http, url, headers, job_id, FINAL, within=40)
        assert waiting["status"] == "JOB_STATUS_NEEDS_ATTENTION", waiting
        # Sweeps go on after it (each a full pass, adoption included): nothing changes.
        seen_at = time.time()
        await scrape_until(
            survivor.metrics_port,
            lambda s: s.get("atelier_reaper_last_sweep_timestamp_seconds") > seen_at + 1,
        )
        again = await job_in(http, url, headers, job_id, FINAL, within=1)
        assert (again["status"], again["version"]) == (
            "JOB_STATUS_NEEDS_ATTENTION",
            waiting["version"],
        )

        internal = f"127.0.0.1:{api.ports.internal['creation']}"
        async with grpc.aio.insecure_channel(internal) as channel:
            admin = admin_service_pb2_grpc.AdminServiceStub(channel)
            inspected = await admin.InspectJob(
                admin_service_pb2.InspectJobRequest(job_id=job_id), metadata=admin_metadata
            )
            assert inspected.lookup_supported
            (found,) = inspected.provider_requests
            assert found.request_id == read_ledger(ledger)[job_id][0]
            assert found.source == admin_service_pb2.PROVIDER_REQUEST_SOURCE_FOUND
            assert found.state == admin_service_pb2.PROVIDER_REQUEST_STATE_SUCCEEDED
            await admin.ResolveJob(
                admin_service_pb2.ResolveJobRequest(
                    job_id=job_id,
                    resolution=admin_service_pb2.RESOLUTION_ADOPT,
                    provider_request_id=found.request_id,
                    operator="alice",
                    reason="INC-1: the stub finished it",
                ),
                metadata=admin_metadata,
            )
        await finished_once(api, http, ledger, job_id, headers)
    finally:
        assert survivor.stop() == 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{api.ports.internal['creation']}") as ch:
        events = await admin_service_pb2_grpc.AdminServiceStub(ch).ListJobEvents(
            admin_service_pb2.ListJobEventsRequest(job_id=job_id), metadata=admin_metadata
        )
    adopted = [e for e in events.events if e.actor_id == "alice"]
    assert [e.reason for e in adopted] == [
        f"adopted provider request {found.request_id}: INC-1: the stub finished it"
    ]


async def test_with_recovery_on_the_reaper_adopts_a_lost_submit_with_no_operator(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    job_id, headers, survivor = await lost_submit(api, http, ledger, "stub")
    try:
        await finished_once(api, http, ledger, job_id, headers)
        await scrape_until(
            survivor.metrics_port, lambda s: s.get("atelier_reaper_adoptions_total") == 1
        )
    finally:
        assert survivor.stop() == 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{api.ports.internal['creation']}") as ch:
        events = await admin_service_pb2_grpc.AdminServiceStub(ch).ListJobEvents(
            admin_service_pb2.ListJobEventsRequest(job_id=job_id),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )
    # The reaper parked it, then adopted it: nobody else decided.
    by_reaper = [e for e in events.events if e.actor_kind == job_pb2.ACTOR_KIND_REAPER]
    assert [(e.from_status, e.to_status) for e in by_reaper] == [
        (job_pb2.JOB_STATUS_RUNNING, job_pb2.JOB_STATUS_NEEDS_ATTENTION),
        (job_pb2.JOB_STATUS_NEEDS_ATTENTION, job_pb2.JOB_STATUS_QUEUED),
    ]
    assert by_reaper[1].reason.startswith("automatic recovery: provider stub holds exactly one")
    assert job_pb2.ACTOR_KIND_OPERATOR not in {e.actor_kind for e in events.events}
