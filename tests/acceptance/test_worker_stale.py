"""A stale worker, as real processes: the first worker freezes (SIGSTOP) while its job
runs at the provider, its lease expires, the second worker's reaper hands the job back and
the second worker takes it over; then the first wakes (SIGCONT) while the second still
holds the job. The first finds its lease gone and writes nothing more — no progress, no
output, no completion, no failure — and the job ends once, by the second worker, with one
submit and its points captured once."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Job, Status, Step
from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.workers import (
    WorkerProcess,
    log_lines,
    new_user,
    output_assets,
    output_ids,
    queue_jobs,
    read_events,
    read_jobs,
    read_points,
    serving,
    start_worker,
    until,
    worker_id,
)

LEASE_SECONDS = 5.0
DURATION_SECONDS = 16.0
STALE_ENV = {
    # Long enough that the second worker still polls when the first wakes.
    "ATELIER_STUB_DURATION": str(DURATION_SECONDS),
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_LEASE_TTL": str(LEASE_SECONDS),
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
}


@pytest.fixture
async def db(api_of_its_own: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(api_of_its_own.database_url))
    yield engine
    await engine.dispose()


async def job_when(db: AsyncEngine, job_id: str, what: str, holds: Callable[[Job], bool]) -> Job:
    async def probe() -> Job | None:
        job = (await read_jobs(db, [job_id]))[job_id]
        return job if holds(job) else None

    return await until(probe, DURATION_SECONDS + 20, what)


def lost_its_lease(worker: WorkerProcess, job_id: str) -> bool:
    return any(
        line.get("action") == "lease_lost" and line.get("job_id") == job_id
        for line in log_lines(worker)
    )


async def test_a_worker_woken_after_its_lease_was_taken_over_writes_nothing(
    api_of_its_own: Stack, db: AsyncEngine, tmp_path: Path
) -> None:
    api = api_of_its_own
    user = new_user("stale")
    env = {**STALE_ENV, "ATELIER_STUB_LEDGER": str(tmp_path / "ledger")}
    (queued,) = await queue_jobs(db, {user: await put_input(api, user)}, 1)
    job_id = queued.job_id

    first = start_worker(api, "stale-first", env)
    second: WorkerProcess | None = None
    try:
        await serving(first)
        first_id = await worker_id(first)
        held = await job_when(
            db, job_id, "generating under the first", lambda j: j.step is Step.GENERATING
        )
        assert (held.lease_owner, held.lease_epoch) == (first_id, 1)
        first.send(signal.SIGSTOP)  # frozen: no beats, no writes, its lease runs out

        second = start_worker(api, "stale-second", env)
        await serving(second)
        second_id = await worker_id(second)
        taken = await job_when(
            db, job_id, "taken over by the second", lambda j: j.lease_owner == second_id
        )
        assert (taken.status, taken.lease_epoch) == (Status.RUNNING, 2)
        assert taken.provider_request_id == held.provider_request_id  # resumed, not resubmitted

        first.send(signal.SIGCONT)  # wakes with a stale lease while the second holds it

        async def first_stopped() -> bool | None:
            return True if lost_its_lease(first, job_id) else None

        await until(first_stopped, within=LEASE_SECONDS, what="the first worker saw its lease lost")
        during = (await read_jobs(db, [job_id]))[job_id]
        assert (during.status, during.lease_owner, during.lease_epoch) == (
            Status.RUNNING,
            second_id,
            2,
        )
        done = await job_when(db, job_id, "finished", lambda j: j.status.terminal)
        codes = [first.stop(), second.stop()]
    finally:
        first.send(signal.SIGCONT)  # a frozen process would ignore the SIGTERM
        first.stop()
        if second is not None:
            second.stop()
    assert codes == [0, 0]

    assert done.status is Status.SUCCEEDED
    # The job ended once, by the second worker; the first wrote only its claim.
    events = await read_events(db, [job_id])
    assert [(e.to_status, e.actor_kind, e.actor_id) for e in events[job_id]] == [
        ("queued", "user", user),
        ("running", "worker", first_id),
        ("queued", "reaper", "reaper"),
        ("running", "worker", second_id),
        ("succeeded", "worker", second_id),
    ]
    assert (done.attempt, done.lease_epoch) == (1, 2)
    assert read_ledger(tmp_path / "ledger") == {job_id: [held.provider_request_id]}
    assert (await read_points(db, [job_id]))[job_id] == [("reserve", 5), ("capture", 5)]
    # One output, the second's; the first left none behind (nor landed one at all).
    (output,) = output_ids(done)
    assert await output_assets(db, [user]) == {output: "ready"}
