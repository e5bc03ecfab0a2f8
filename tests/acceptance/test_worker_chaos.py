"""Workers killed, frozen and restarted at random while users submit and cancel, media
frozen now and then: real processes, the way an outside prober treats the system.

The crash matrix (test_worker_crashes.py) kills one worker at each named point of one
job; here three workers run many jobs at once and the signals fall wherever they fall
(a fixed seed picks which and when, the machine's timing does the rest). However they
fall, every job ends; the provider sees at most one submit per job, so an unknown
outcome waits for an operator instead of running twice; nobody is charged twice and the
balances add up; every output is attached to its job or deleted; every outbox row is
delivered and every job's final version reaches notify (the relay coalesces a job's
superseded versions within a round; every consumer is version-gated)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from atelier_client import AsyncClient, FailedPrecondition, RetryPolicy
from services.creation.providers.stub import read_ledger
from services.dev.stack import Stack
from services.kit.listen import asyncpg_dsn
from tests.acceptance.test_jobs_edge import User, put_input
from tests.support.stacks import stack_of_its_own
from tests.support.workers import WorkerProcess, start_worker

USERS = 8
JOBS_PER_USER = 24
SEED = 20261201
# The signals, in an order the seed shuffles, each after a pause of 0.5-1.5 s: about 20 s
# of disturbance over the ~15 s of submits and the jobs still running after them.
PLAN = ["kill"] * 5 + ["freeze worker"] * 3 + ["freeze media"] * 2
random.Random(SEED).shuffle(PLAN)
# Short leases and beats so a dead worker's jobs come back within seconds; a submit that
# takes a while, so some kills fall between the provider's answer and its record.
ENGINE_ENV = {
    "ATELIER_STUB_DURATION": "1",
    "ATELIER_STUB_LATENCY": "0.3",
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_REAPER_PERIOD": "0.5",
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_WORKER_POLL": "0.5",
    "ATELIER_WORKER_CONCURRENCY": "12",
    "ATELIER_BACKOFF_BASE": "0.2",
    "ATELIER_BACKOFF_MAX": "1",
    "ATELIER_MAX_ATTEMPTS": "5",
}
LIMITS = {
    "ATELIER_ENV": "test",
    # Six processes on a server other modules share: its connection limit is theirs too.
    "ATELIER_DB_POOL_SIZE": "4",
    "ATELIER_IN_FLIGHT_LIMIT": "1000",
    "ATELIER_DAILY_QUOTA": "10000",
    "ATELIER_WELCOME_POINTS": "100000",
    "ATELIER_REAPER_PERIOD": "0.5",
}
# What each end leaves in the job's ledger (DESIGN.md, "Quotas and points").
LEDGER_BY_STATUS = {
    "succeeded": ["capture", "reserve"],
    "cancelled": ["release", "reserve"],
    "failed": ["release", "reserve"],
    "needs_attention": ["reserve"],
}


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("chaos")
    with stack_of_its_own(postgres_admin_url, work, "api", LIMITS) as stack:
        yield stack


class Workers:
    """Three worker processes; a killed one is replaced at once, as a supervisor would."""

    def __init__(self, api: Stack, ledger: Path) -> None:
        self._api = api
        self._ledger = ledger
        self._started = 0
        self.workers = [self._start() for _ in range(3)]

    def _start(self) -> WorkerProcess:
        self._started += 1
        env = {**LIMITS, **ENGINE_ENV, "ATELIER_STUB_LEDGER": str(self._ledger)}
        return start_worker(self._api, f"chaos-worker-{self._started}", env)

    def kill(self, slot: int) -> None:
        self.workers[slot].send(signal.SIGKILL)
        self.workers[slot].child.process.wait()
        self.workers[slot] = self._start()

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.send(signal.SIGCONT)  # a frozen one must hear the SIGTERM
            worker.stop()


async def test_random_kills_and_freezes_lose_no_job_and_charge_nobody_twice(
    api: Stack, tmp_path: Path
) -> None:
    ledger = tmp_path / "stub-ledger"
    fleet = Workers(api, ledger)
    media = next(child for child in api.children if child.name == "media")
    users = [User() for _ in range(USERS)]
    inputs = [await put_input(api, user.user_id) for user in users]
    client = AsyncClient.connect(
        f"127.0.0.1:{api.ports.public['creation']}",
        token="",
        retry=RetryPolicy(max_attempts=60, deadline=120.0),
    )
    submitted: set[str] = set()
    plan = random.Random(SEED)

    async def submit_and_cancel(index: int) -> None:
        caller = client.with_token(users[index].token)
        chance = random.Random(SEED + index)
        mine: list[str] = []
        for n in range(JOBS_PER_USER):
            job = await caller.submit(
                model_id="stub-fast",
                style_id="watercolor",
                input_asset_id=inputs[index],
                prompt="chaos",
                width=512,
                height=512,
                num_outputs=1 + n % 2,
            )
            submitted.add(job.job_id)
            mine.append(job.job_id)
            await asyncio.sleep(chance.uniform(0.2, 1.0))
            if chance.random() < 0.15:
                # Finished ones refuse; whatever state the others are in, cancel wins.
                with contextlib.suppress(FailedPrecondition):
                    await caller.cancel_job(chance.choice(mine))

    async def disturb() -> None:
        for action in PLAN:
            await asyncio.sleep(plan.uniform(0.5, 1.5))
            slot = plan.randrange(3)
            if action == "kill":
                fleet.kill(slot)
            elif action == "freeze worker":
                worker = fleet.workers[slot]
                worker.send(signal.SIGSTOP)
                await asyncio.sleep(plan.uniform(1, 8))  # past the lease (5 s), at times
                worker.send(signal.SIGCONT)
            else:
                media.process.send_signal(signal.SIGSTOP)
                await asyncio.sleep(plan.uniform(0.5, 3))
                media.process.send_signal(signal.SIGCONT)

    database = await asyncpg.connect(asyncpg_dsn(api.database_url))
    try:
        await asyncio.gather(disturb(), *(submit_and_cancel(i) for i in range(USERS)))
        await _settled(database)
        await _checked(database, ledger, submitted)
    finally:
        media.process.send_signal(signal.SIGCONT)
        fleet.stop_all()
        await client.close()
        await database.close()


async def _until_zero(database: asyncpg.Connection, query: str, within: float) -> None:
    deadline = time.monotonic() + within
    while (left := await database.fetchval(query)) != 0:
        assert time.monotonic() < deadline, f"{left} left after {within:g} s: {query}"
        await asyncio.sleep(0.2)


async def _settled(database: asyncpg.Connection) -> None:
    """Every job ended, every listed output purged, every outbox row delivered, and
    notify's projection holds every job at its final version."""
    await _until_zero(
        database, "SELECT count(*) FROM creation.jobs WHERE status IN ('queued', 'running')", 90
    )
    await _until_zero(database, "SELECT count(*) FROM creation.output_purges", 20)
    await _until_zero(
        database, "SELECT count(*) FROM creation.outbox WHERE delivered_at IS NULL", 20
    )
    await _until_zero(
        database,
        "SELECT count(*) FROM creation.jobs AS j"
        " LEFT JOIN notify.job_states AS s ON s.job_id = j.job_id"
        " WHERE s.version IS DISTINCT FROM j.version",
        20,
    )


async def _checked(database: asyncpg.Connection, ledger: Path, submitted: set[str]) -> None:
    rows = await database.fetch(
        "SELECT job_id::text, user_id, status, error_code, num_outputs, outputs,"
        " (SELECT array_agg(kind::text ORDER BY kind) FROM creation.points_ledger AS l"
        "  WHERE l.job_id = j.job_id) AS entries"
        " FROM creation.jobs AS j"
    )
    jobs = {row["job_id"]: row for row in rows}
    assert set(jobs) == submitted  # none lost, none made up
    submits = read_ledger(ledger)
    for job_id, job in jobs.items():
        status = job["status"]
        assert status in LEDGER_BY_STATUS, (job_id, status)
        assert list(job["entries"]) == LEDGER_BY_STATUS[status], (job_id, status)
        # The stub never fails, so no attempt ever had reason to submit again.
        assert len(submits.get(job_id, [])) <= 1, (job_id, submits[job_id])
        if status == "succeeded":
            assert len(submits[job_id]) == 1
            assert len(job["outputs"]) == job["num_outputs"], job_id
        if status == "needs_attention":
            assert job["error_code"] == "OUTCOME_UNKNOWN", job_id
        if status == "failed":
            # Only by attempts used up: leases lost to kills, or media frozen at a read.
            assert job["error_code"] in {"LEASE_EXPIRED", "MEDIA_UNAVAILABLE"}, job_id
    # The one-row balances agree with the ledger they summarise.
    drift = await database.fetch(
        "SELECT t.user_id FROM creation.ledger_totals AS t"
        " JOIN (SELECT user_id,"
        "   coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0) AS reserved,"
        "   coalesce(sum(amount) FILTER (WHERE kind = 'capture'), 0) AS captured,"
        "   coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0) AS released"
        "   FROM creation.points_ledger GROUP BY user_id) AS s USING (user_id)"
        " WHERE (t.reserved, t.captured, t.released) <> (s.reserved, s.captured, s.released)"
    )
    assert drift == []
    # Every output media holds is a succeeded job's, or deleted: none orphaned.
    attached = {
        str(asset)
        for job in jobs.values()
        if job["status"] == "succeeded"
        for asset in job["outputs"]
    }
    held = await database.fetch(
        "SELECT asset_id::text, status FROM media.assets WHERE purpose = 'ai_output'"
    )
    ready = {row["asset_id"] for row in held if row["status"] == "ready"}
    assert ready == attached
