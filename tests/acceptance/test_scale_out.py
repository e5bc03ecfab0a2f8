"""Scale-out on one machine: two processes of each kind — creation's API, creation's
workers, media, notify — on one PostgreSQL database and one Redis, Envoy balancing over
them. Users submit jobs through the edge and follow them on WatchJobs streams; under that
load one replica of each kind is killed (SIGKILL, no drain). Then:

- no job is lost: every job a client was answered for ends SUCCEEDED, each Idempotency-Key
  made one job, and nobody's jobs appeared that no client asked for;
- none is charged twice: each job's points are reserved once and captured once, and the
  provider saw one submit for it;
- every stream resumed from its cursor: a broken stream reconnected with the last cursor
  it had, got every state it missed, and no finished job twice;
- clients saw only retryable errors (HTTP 503 with a JSON UNAVAILABLE status, gRPC
  UNAVAILABLE), each of them kept and checked;
- throughput recovers once the killed worker's jobs have been taken back.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import job_pb2
from services.creation.domain import Status
from services.creation.providers.stub import read_ledger
from services.creation.tables import jobs
from services.dev import postgres
from services.dev.fleet import KINDS, Fleet
from services.kit import migrations
from services.kit.db import asyncpg_url
from services.notify.tables import job_states
from tests.support.scale_out import TERMINAL, Load, Watcher, fleet_env
from tests.support.workers import read_jobs, read_points, until

USERS = 8
IN_FLIGHT = 2  # jobs each user keeps going
WARM_UP = 16  # completions before measuring
MEASURE = 24  # completions per measured window
# Jobs of about a second: a kill finds some RUNNING, mid-GENERATING.
STUB_DURATION = 0.8


@pytest.fixture(scope="module")
def fleet(
    postgres_admin_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    work: Path = tmp_path_factory.mktemp("scale-out")
    name = f"atelier_scale_{uuid.uuid4().hex[:10]}"
    url = postgres.ensure_database(postgres_admin_url, name)
    for service in ("creation", "media", "notify"):
        migrations.upgrade(service, url)
    running = Fleet(
        database_url=url,
        redis_url=redis_url,
        work_dir=work,
        replicas=2,
        extra_env={**fleet_env(STUB_DURATION), "ATELIER_STUB_LEDGER": str(work / "ledger")},
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()
        postgres.drop_database(postgres_admin_url, name)


@pytest.fixture
async def db(fleet: Fleet) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(fleet.database_url))
    yield engine
    await engine.dispose()


async def worker_id(fleet: Fleet, index: int) -> str:
    """The id a worker process writes as its lease owner, from its start line."""
    log = fleet.replica("creation-worker", index).child.log_path
    assert log is not None

    async def probe() -> str | None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"worker_started"' in line:
                return str(json.loads(line)["worker_id"])
        return None

    return await until(probe, within=10, what="the worker's start line")


async def held_by(
    db: AsyncEngine, worker: str, step: str | None = "generating"
) -> dict[str, str] | None:
    """The RUNNING jobs ``worker`` holds (in ``step``, or any), job id -> step; None for
    none."""
    query = select(jobs.c.job_id, jobs.c.step).where(
        jobs.c.status == Status.RUNNING.value, jobs.c.lease_owner == worker
    )
    if step is not None:
        query = query.where(jobs.c.step == step)
    async with db.connect() as connection:
        rows = (await connection.execute(query)).all()
    return {str(r.job_id): str(r.step) for r in rows} or None


async def missed(db: AsyncEngine, watchers: list[Watcher]) -> bool | None:
    """True once every watcher's user has a job (new or not) whose projected version is
    newer than what the user's stream delivered."""
    async with db.connect() as connection:
        rows = (
            await connection.execute(
                select(job_states.c.user_id, job_states.c.job_id, job_states.c.version)
            )
        ).all()
    for watcher in watchers:
        seen = watcher.versions_before(len(watcher.started_from))
        if not any(
            r.user_id == watcher.user_id and r.version > seen.get(str(r.job_id), 0) for r in rows
        ):
            return None
    return True


async def all_ended(db: AsyncEngine, job_ids: set[str]) -> bool | None:
    """True once none of ``job_ids`` is QUEUED or RUNNING."""
    async with db.connect() as connection:
        left = (
            await connection.execute(
                select(func.count()).where(
                    jobs.c.job_id.in_(list(job_ids)),
                    jobs.c.status.in_([Status.QUEUED.value, Status.RUNNING.value]),
                )
            )
        ).scalar_one()
    return True if left == 0 else None


def busiest_notify(fleet: Fleet, load: Load) -> int:
    """The notify replica holding the most of the clients' streams (the edge names the
    replica behind each stream)."""
    held = Counter(w.upstreams[-1] for w in load.watchers.values())
    addresses = [f"127.0.0.1:{p.public}" for p in fleet.ports["notify"]]
    return max(range(len(addresses)), key=lambda i: held[addresses[i]])


async def test_killing_one_replica_of_each_kind_under_load_loses_nothing(
    fleet: Fleet, db: AsyncEngine
) -> None:
    load = Load(fleet.edge_url, fleet.edge_address, users=USERS, in_flight=IN_FLIGHT)
    try:
        await load.prepare()
        load.start()
        await load.completions(WARM_UP, within=60)
        await load.completions(WARM_UP + MEASURE, within=60)
        before = load.rate(WARM_UP, WARM_UP + MEASURE)

        # One of each kind, at once; for notify the one with the most streams on it.
        victims = {kind: 0 for kind in KINDS} | {"notify": busiest_notify(fleet, load)}
        worker = await worker_id(fleet, victims["creation-worker"])
        # The worker dies holding jobs: wait until it has one mid-generation.
        await until(lambda: held_by(db, worker), within=30, what=f"{worker} generating")
        killed_notify = f"127.0.0.1:{fleet.ports['notify'][victims['notify']].public}"
        cut = [w for w in load.watchers.values() if w.upstreams[-1] == killed_notify]
        gate = asyncio.Event()
        for watcher in cut:
            watcher.resume_gate = gate
        unfinished = load.unfinished()
        # The worker first, so it dies holding what it was seen generating: killed last,
        # it could finish those jobs in between, or hand them back when media died first.
        for kind in sorted(victims, key=lambda kind: kind != "creation-worker"):
            fleet.kill(kind, victims[kind])
        killed_at = time.monotonic()
        # Dead, it writes nothing more: what its leases still hold is what it died with.
        dropped = await held_by(db, worker, step=None) or {}
        # The cut streams reconnect once their users' jobs have moved on meanwhile: what
        # they missed can only come from their cursors.
        await until(lambda: missed(db, cut), within=30, what="a change while streams were cut")
        gate.set()
        # The jobs in flight at the kill, the dead worker's among them, finish.
        await load.all_finished(unfinished, within=45)
        await until(lambda: all_ended(db, set(dropped)), within=45, what="the dead worker's jobs")
        recovered_in = time.monotonic() - killed_at
        counted = len(load.completed)
        await load.completions(counted + MEASURE, within=45)
        after = load.rate(counted, counted + MEASURE)
        await load.finish(within=45)
    finally:
        await load.close()
    print(
        f"jobs/s with 2 replicas of each kind {before:.1f}, after killing one of each "
        f"{after:.1f}; jobs in flight at the kill all finished {recovered_in:.1f} s after it"
    )
    print(f"errors the clients saw: {dict(load.errors.summary())}")

    # Only retryable errors, every one of them.
    for what, status, body in load.errors.http:
        assert status == 503, (what, status, body)
        assert json.loads(body)["code"] == 14, (what, body)
    for what, code, detail in load.errors.grpc:
        assert code == "UNAVAILABLE", (what, code, detail)
    assert load.errors.transport == []

    # No job lost: each key made one job, all SUCCEEDED, and no job nobody asked for. The
    # one exception is the design's: a job the dead worker held between recording
    # SUBMITTING and recording the provider's request id may have reached the provider or
    # not, so the reaper parks it in NEEDS_ATTENTION for an operator (the stub provider
    # does not promise idempotent submits); its points stay reserved, never captured.
    asked = {user.user_id: set(user.jobs.values()) for user in load.users}
    for user in load.users:
        assert len(set(user.jobs.values())) == len(user.jobs), user.user_id
    job_ids = load.job_ids()
    finished = await read_jobs(db, job_ids)
    assert set(finished) == job_ids
    parked = {j for j, job in finished.items() if job.status == Status.NEEDS_ATTENTION}
    assert parked <= {j for j, step in dropped.items() if step == "submitting"}, parked
    succeeded = job_ids - parked
    assert {finished[j].status for j in succeeded} == {Status.SUCCEEDED}
    # What the dead worker held was taken back and finished (or parked, as above).
    assert dropped and all(finished[j].lease_epoch > 1 for j in set(dropped) - parked)
    print(f"the killed worker held {len(dropped)} jobs; parked for an operator: {len(parked)}")
    async with db.connect() as connection:
        stored = (
            await connection.execute(select(jobs.c.user_id, func.count()).group_by(jobs.c.user_id))
        ).all()
    assert {row[0]: row[1] for row in stored} == {u: len(ids) for u, ids in asked.items()}

    # None charged twice: reserved once, captured once; one provider submit each.
    points = await read_points(db, job_ids)
    assert points == {
        job_id: [("reserve", 5)] if job_id in parked else [("reserve", 5), ("capture", 5)]
        for job_id in job_ids
    }
    submits = read_ledger(fleet.work_dir / "ledger")
    assert {job_id: len(submits.get(job_id, [])) for job_id in succeeded} == dict.fromkeys(
        succeeded, 1
    )
    assert all(len(submits.get(job_id, [])) <= 1 for job_id in parked)

    # Every stream on the killed notify broke, and only those; each reconnected from the
    # cursor it had and got every state it missed, and no finished job twice.
    breaks: Counter[str] = Counter()
    for user in load.users:
        watcher = load.watchers[user.user_id]
        assert {b.upstream for b in watcher.breaks} <= {killed_notify}, watcher.breaks
        breaks.update(b.how for b in watcher.breaks)
        # A stream the killed replica held ended, and the client connected again ...
        on_killed = [c for c, up in enumerate(watcher.upstreams) if up == killed_notify]
        assert all(c + 1 < len(watcher.started_from) for c in on_killed), watcher.upstreams
        # ... from the cursor it had, never afresh.
        assert all(watcher.started_from[1:]), watcher.started_from
        for job_id in user.jobs.values():
            seen = watcher.seen[job_id]
            # Its final state, as stored.
            assert seen[-1].version == finished[job_id].version, (job_id, seen)
            assert seen[-1].status == (
                job_pb2.JOB_STATUS_NEEDS_ATTENTION
                if job_id in parked
                else job_pb2.JOB_STATUS_SUCCEEDED
            )
            # Versions only go up; a reconnect's snapshot may repeat the state an
            # unfinished job had, never an older one, and a finished job never comes again.
            for earlier, later in itertools.pairwise(seen):
                if later.connection == earlier.connection or not later.in_snapshot:
                    assert later.version > earlier.version, (job_id, seen)
                else:
                    assert later.version >= earlier.version, (job_id, seen)
                    assert earlier.status not in TERMINAL, (job_id, seen)
    print(f"streams broken by the kill, as the clients saw it: {dict(breaks)}")
    assert cut and sum(breaks.values()) >= len(cut), "no stream was on the killed notify"
    # Each cut stream's reconnect brought what changed while it was away.
    for watcher in cut:
        resumed = len(watcher.upstreams) - 1
        had = watcher.versions_before(resumed)
        caught_up = [
            job_id
            for job_id, seen in watcher.seen.items()
            if any(v.connection == resumed and v.version > had.get(job_id, 0) for v in seen)
        ]
        assert caught_up, (watcher.started_from, had)

    # Throughput came back (the figures themselves are in docs/benchmarks.md).
    assert after >= before * 0.4, (before, after)
