"""SIGTERM to a worker process while 20 jobs run at the provider: it stops claiming, lets
what can finish finish, hands the rest back (queued, request id kept) and exits within
its drain timeout; a second worker resumes polling the handed-back requests without a
second submit. No job ends in NEEDS_ATTENTION because of the drain."""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Job, Status, Step
from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.workers import (
    exited,
    new_user,
    queue_jobs,
    read_events,
    read_jobs,
    read_points,
    seconds_between,
    serving,
    start_worker,
    until,
    worker_id,
)

DURATION_SECONDS = 10.0
DRAIN_SECONDS = 8.0
GRACE_SECONDS = 10.0
DRAIN_ENV = {
    "ATELIER_STUB_DURATION": str(DURATION_SECONDS),
    # Each poll takes a while, so SIGTERM finds polls in flight.
    "ATELIER_STUB_LATENCY": "0.2",
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_WORKER_CONCURRENCY": "32",
    "ATELIER_WORKER_DRAIN": str(DRAIN_SECONDS),
    "ATELIER_DRAIN_GRACE": str(GRACE_SECONDS),
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
}


@pytest.fixture
async def db(api_of_its_own: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(api_of_its_own.database_url))
    yield engine
    await engine.dispose()


async def jobs_when(
    db: AsyncEngine, job_ids: Collection[str], holds: str, within: float
) -> dict[str, Job]:
    """The jobs once each is generating at the provider (``holds="generating"``) or
    finished (``holds="finished"``)."""

    async def probe() -> dict[str, Job] | None:
        found = await read_jobs(db, job_ids)
        if holds == "generating":
            ok = all(
                j.status is Status.RUNNING and j.step is Step.GENERATING for j in found.values()
            )
        else:
            ok = all(j.status.terminal for j in found.values())
        return found if ok else None

    return await until(probe, within, f"{len(job_ids)} jobs {holds}")


async def test_sigterm_during_twenty_running_jobs_finishes_or_hands_back_each(
    api_of_its_own: Stack, db: AsyncEngine, tmp_path: Path
) -> None:
    api = api_of_its_own
    ledger = tmp_path / "ledger"
    env = {**DRAIN_ENV, "ATELIER_STUB_LEDGER": str(ledger)}
    early_user, late_user = new_user("drain-early"), new_user("drain-late")
    inputs = {user: await put_input(api, user) for user in (early_user, late_user)}

    first = start_worker(api, "drain-first", env)
    try:
        await serving(first)
        # Ten jobs that will be nearly done when SIGTERM comes, ten just started.
        early = {q.job_id for q in await queue_jobs(db, {early_user: inputs[early_user]}, 10)}
        await jobs_when(db, early, "generating", within=30)

        async def early_half_done() -> bool | None:
            found = await read_jobs(db, early)
            return True if min(j.progress for j in found.values()) >= 50 else None

        # Half done: at most 5 s to go, well inside the drain; the late ones have 10 s.
        await until(early_half_done, within=DURATION_SECONDS + 10, what="early jobs at 50%")
        late = {q.job_id for q in await queue_jobs(db, {late_user: inputs[late_user]}, 10)}
        await jobs_when(db, late, "generating", within=30)
        at_sigterm = await read_jobs(db, early | late)
        first_id = await worker_id(first)
        assert all(
            (j.status, j.step, j.lease_owner) == (Status.RUNNING, Step.GENERATING, first_id)
            for j in at_sigterm.values()
        ), "not all 20 jobs were running at the provider when SIGTERM came"

        asked = time.monotonic()
        first.send(signal.SIGTERM)
        code = await exited(first, within=DRAIN_SECONDS + 10)
        took = time.monotonic() - asked
    finally:
        first.stop()
    assert code == 0
    # The engine stopped within its drain timeout, by its own clock (SIGTERM handled at
    # once); the whole process within the service's grace, plus its interpreter's exit,
    # which a busy machine slows by seconds.
    drained = seconds_between(first, "service_draining", "worker_stopped")
    assert drained <= DRAIN_SECONDS, f"the worker stopped {drained:.1f} s after SIGTERM"
    assert took <= GRACE_SECONDS + 5.0, f"exited {took:.1f} s after SIGTERM"
    print(f"first worker drained in {drained:.1f} s, exited {took:.1f} s after SIGTERM")

    after = await read_jobs(db, early | late)
    for job_id, job in after.items():
        if job.status is Status.SUCCEEDED:
            continue
        # Handed back: queued again, nobody's lease, the provider's request kept, the
        # attempt still the first.
        assert (job.status, job.lease_owner, job.attempt) == (Status.QUEUED, None, 1), job
        assert job.provider_request_id == at_sigterm[job_id].provider_request_id
        assert job.step is Step.GENERATING
    # Those under 5 s from done finished within the drain; those 10 s away went back.
    assert {j for j in early if after[j].status is Status.SUCCEEDED} == early
    assert {j for j in late if after[j].status is Status.QUEUED} == late

    second = start_worker(api, "drain-second", env)
    try:
        await serving(second)
        done = await jobs_when(db, early | late, "finished", within=DURATION_SECONDS + 20)
        second_id = await worker_id(second)
    finally:
        assert second.stop() == 0
    assert {j.status for j in done.values()} == {Status.SUCCEEDED}

    events = await read_events(db, early | late)
    for job_id in late:
        # Claimed by the first, handed back by it, resumed and completed by the second.
        assert [(e.to_status, e.actor_id, e.reason) for e in events[job_id][1:]] == [
            ("running", first_id, "claimed"),
            ("queued", first_id, "handed back"),
            ("running", second_id, "claimed"),
            ("succeeded", second_id, "completed"),
        ], job_id
        assert done[job_id].attempt == 1
    # One submit per job: the second worker polled the requests the first had made.
    submits = read_ledger(ledger)
    assert submits == {job_id: [done[job_id].provider_request_id] for job_id in early | late}
    points = await read_points(db, early | late)
    assert points == {job_id: [("reserve", 5), ("capture", 5)] for job_id in early | late}
