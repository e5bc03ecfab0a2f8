"""Two worker processes on 400 queued jobs, as `atelier serve creation --role worker`
runs them: every job runs exactly once — one claim, one lease, one submit to the
provider, one output, its points captured once — whichever worker took it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Status
from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.workers import (
    all_finished,
    new_user,
    output_assets,
    output_ids,
    queue_jobs,
    read_events,
    read_jobs,
    read_points,
    serving,
    start_worker,
)

# 400 jobs: every claim round still races the other process for the same rows, at a
# fraction of the suite's time that 1,000 took (make test's budget, issue 31).
USERS = 20
PER_USER = 20  # 100 welcome points at a price of 5
JOBS = USERS * PER_USER
FLEET_ENV = {
    # Done on the first poll: the engine's own work is what this runs.
    "ATELIER_STUB_DURATION": "0",
    "ATELIER_STUB_LATENCY": "0",
    "ATELIER_WORKER_CONCURRENCY": "16",
    "ATELIER_WORKER_CLAIM_BATCH": "16",
    "ATELIER_WORKER_POLL": "0.5",
}


@pytest.fixture
async def db(api_of_its_own: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(api_of_its_own.database_url))
    yield engine
    await engine.dispose()


async def test_two_workers_run_each_of_four_hundred_jobs_exactly_once(
    api_of_its_own: Stack, db: AsyncEngine, tmp_path: Path
) -> None:
    api = api_of_its_own
    users = [new_user("fleet") for _ in range(USERS)]
    inputs = await asyncio.gather(*(put_input(api, user) for user in users))
    queued = await queue_jobs(db, dict(zip(users, inputs, strict=True)), PER_USER)
    job_ids = {q.job_id for q in queued}
    assert len(job_ids) == JOBS

    ledger = tmp_path / "ledger"
    env = {**FLEET_ENV, "ATELIER_STUB_LEDGER": str(ledger)}
    started = time.monotonic()
    workers = [start_worker(api, f"fleet-worker-{n}", env) for n in (1, 2)]
    try:
        await asyncio.gather(*(serving(w) for w in workers))
        await all_finished(db, workers, within=240)
        elapsed = time.monotonic() - started
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0]
    print(f"{JOBS} jobs by 2 worker processes in {elapsed:.1f} s ({JOBS / elapsed:.0f} jobs/s)")

    finished = await read_jobs(db, job_ids)
    assert Counter(j.status for j in finished.values()) == {Status.SUCCEEDED: JOBS}
    # One claim each, ever: a second lease on a job would have bumped its epoch.
    assert {(j.attempt, j.lease_epoch) for j in finished.values()} == {(1, 1)}

    # From the events: queued by its user, claimed by one worker, completed by the same
    # worker; no reaper, no hand-back, no second claim.
    events = await read_events(db, job_ids)
    claimed_by: Counter[str] = Counter()
    for job_id, history in events.items():
        owner = history[1].actor_id
        assert [(e.from_status, e.to_status, e.actor_kind, e.actor_id) for e in history] == [
            (None, "queued", "user", finished[job_id].user_id),
            ("queued", "running", "worker", owner),
            ("running", "succeeded", "worker", owner),
        ], job_id
        claimed_by[owner] += 1
    assert len(events) == JOBS
    # Both processes took part (a fleet, not one worker and a bystander).
    assert len(claimed_by) == 2 and min(claimed_by.values()) > 0, claimed_by
    print(f"claims per worker: {sorted(claimed_by.values())}")

    # The provider saw exactly one submit per job, the one whose request the job holds.
    submits = read_ledger(ledger)
    assert set(submits) == job_ids
    assert {job_id: ids for job_id, ids in submits.items()} == {
        job_id: [finished[job_id].provider_request_id] for job_id in job_ids
    }

    # Points reserved once and captured once per job.
    points = await read_points(db, job_ids)
    assert {job_id: entries for job_id, entries in points.items()} == {
        job_id: [("reserve", 5), ("capture", 5)] for job_id in job_ids
    }

    # One output per job, each its own, ready; none left over.
    outputs = await output_assets(db, users)
    assert all(len(output_ids(job)) == 1 for job in finished.values())
    assert outputs == {asset: "ready" for job in finished.values() for asset in output_ids(job)}
