"""The projection on real PostgreSQL: a row moves only to a higher version, so duplicated,
reordered and concurrent deliveries change nothing; every move draws a higher seq, the
cursor WatchJobs resumes from."""

from __future__ import annotations

import asyncio
import random

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from services.notify.store import ProjectionStore
from services.notify.tables import job_states
from tests.support.notify import job_state, new_job_id


async def stored(engine: AsyncEngine) -> dict[str, tuple[int, str, bool, job_pb2.Job]]:
    async with engine.connect() as connection:
        rows = (await connection.execute(select(job_states))).all()
    return {
        str(r.job_id): (r.version, r.status, r.terminal, job_pb2.Job.FromString(r.state))
        for r in rows
    }


async def test_only_a_higher_version_moves_a_row(engine: AsyncEngine) -> None:
    projection = ProjectionStore(engine)
    job = new_job_id()
    first = await projection.apply([job_state(job, 3, progress=30)])
    assert [(a.job_id, a.version) for a in first] == [(job, 3)]

    assert await projection.apply([job_state(job, 3, progress=99)]) == []  # duplicate
    assert await projection.apply([job_state(job, 2, progress=20)]) == []  # older
    assert (await stored(engine))[job][3].progress_percent == 30

    done = job_state(job, 4, status=job_pb2.JOB_STATUS_SUCCEEDED, progress=100)
    moved = await projection.apply([done])
    assert [a.version for a in moved] == [4] and moved[0].seq > first[0].seq
    version, status, terminal, state = (await stored(engine))[job]
    assert (version, status, terminal, state) == (4, "succeeded", True, done)


async def test_one_batch_keeps_the_highest_version_of_each_job(engine: AsyncEngine) -> None:
    projection = ProjectionStore(engine)
    a, b = new_job_id(), new_job_id()
    batch = [job_state(a, 2), job_state(b, 5), job_state(a, 4), job_state(a, 3), job_state(b, 5)]
    moved = await projection.apply(batch)
    assert sorted((m.job_id, m.version) for m in moved) == sorted([(a, 4), (b, 5)])
    assert [m.seq for m in moved] == sorted(m.seq for m in moved)
    assert {job: row[0] for job, row in (await stored(engine)).items()} == {a: 4, b: 5}


async def test_duplicates_and_any_order_never_move_a_version_back(engine: AsyncEngine) -> None:
    projection = ProjectionStore(engine)
    jobs = [new_job_id() for _ in range(12)]
    deliveries = [job_state(job, v, progress=v) for job in jobs for v in range(1, 9)] * 2
    for seed in range(5):
        rng = random.Random(seed)
        rng.shuffle(deliveries)
        highest: dict[str, int] = {}
        position = 0
        while position < len(deliveries):
            size = rng.randint(1, 9)
            batch = deliveries[position : position + size]
            position += size
            moved = await projection.apply(batch)
            for applied in moved:
                # Reported as moved only when it really moved forward.
                assert applied.version > highest.get(applied.job_id, 0)
                highest[applied.job_id] = applied.version
            now = {job: row[0] for job, row in (await stored(engine)).items()}
            assert now == highest  # what moved is exactly what is stored
        assert highest == dict.fromkeys(jobs, 8)
        # The next round starts from a projection that is already at the top: nothing moves.
        assert await projection.apply(deliveries) == []
        highest.clear()
        await _empty(engine)


async def _empty(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(job_states.delete())


async def test_concurrent_applies_of_the_same_jobs_end_at_the_top(engine: AsyncEngine) -> None:
    projection = ProjectionStore(engine)
    jobs = [new_job_id() for _ in range(30)]
    batches = []
    for seed in range(8):
        batch = [job_state(job, v) for job in jobs for v in range(1, 6)]
        random.Random(seed).shuffle(batch)
        batches.append(batch[:90])
    batches.append([job_state(job, 5) for job in jobs])
    results = await asyncio.gather(*(projection.apply(b) for b in batches))
    assert {job: row[0] for job, row in (await stored(engine)).items()} == dict.fromkeys(jobs, 5)
    seqs = [applied.seq for moved in results for applied in moved]
    assert len(seqs) == len(set(seqs))  # every move drew its own seq


async def test_changed_since_and_latest_read_what_moved(engine: AsyncEngine) -> None:
    projection = ProjectionStore(engine)
    alice_1, alice_2, bob_1 = new_job_id(), new_job_id(), new_job_id()
    first = await projection.apply(
        [job_state(alice_1, 1, user_id="alice"), job_state(bob_1, 1, user_id="bob")],
    )
    cursor = max(a.seq for a in first)
    later = await projection.apply(
        [job_state(alice_2, 1, user_id="alice"), job_state(alice_1, 2, user_id="alice")],
    )

    since = await projection.changed_since(["alice"], cursor)
    assert [(a.job_id, a.version) for a in since] == [(a.job_id, a.version) for a in later]
    assert [a.seq for a in since] == sorted(a.seq for a in since)
    everything = await projection.changed_since(["alice", "bob"], 0)
    assert sorted(a.job_id for a in everything) == sorted([alice_1, alice_2, bob_1])
    assert await projection.changed_since(["carol"], 0) == []

    found = {a.job_id: a.version for a in await projection.latest([alice_1, bob_1])}
    assert found == {alice_1: 2, bob_1: 1}
    assert await projection.latest([new_job_id()]) == []
