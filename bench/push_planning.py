"""What recording pushes adds to Deliver's transaction: the projection's apply alone (the
anchor), apply with push planning for owners without tokens (one more statement), and
with a device and a Live Activity token per job (alert/update/end planning). Each mode
applies the same run of states, one job version per call, as the relay's small batches
do; figures are this process's CPU time per apply (the part planning adds in Python) and
wall time, beside the anchor's.

    .venv/bin/python bench/push_planning.py [--jobs 200] [--versions 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import job_pb2
from services.dev import postgres
from services.kit import migrations
from services.kit.db import asyncpg_url
from services.notify.pushes.planner import PushPlanner
from services.notify.pushes.planning import Rules
from services.notify.store import ProjectionStore

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def run_of(job_id: str, user_id: str, versions: int) -> list[job_pb2.Job]:
    states = [
        job_pb2.Job(
            job_id=job_id,
            user_id=user_id,
            version=v,
            status=job_pb2.JOB_STATUS_RUNNING,
            progress_percent=min(100, v * 10),
        )
        for v in range(1, versions)
    ]
    states.append(
        job_pb2.Job(
            job_id=job_id, user_id=user_id, version=versions, status=job_pb2.JOB_STATUS_SUCCEEDED
        )
    )
    return states


async def register(engine: AsyncEngine, user_id: str, job_id: str) -> None:
    device = str(uuid.uuid4())
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO notify.push_tokens
                    (token_id, user_id, kind, token, environment, bundle_id, registered_at)
                VALUES (:id, :user, 'device', :token, 'sandbox', 'dev.atelier.app', now())
                """
            ),
            {"id": device, "user": user_id, "token": uuid.uuid4().hex * 2},
        )
        await connection.execute(
            text(
                """
                INSERT INTO notify.push_tokens
                    (token_id, user_id, kind, token, environment, bundle_id, job_id,
                     activity_id, device_id, registered_at)
                VALUES (:id, :user, 'activity', :token, 'sandbox', 'dev.atelier.app', :job,
                        'a', :device, now())
                """
            ),
            {
                "id": str(uuid.uuid4()),
                "user": user_id,
                "token": uuid.uuid4().hex * 2,
                "job": job_id,
                "device": device,
            },
        )


async def mode(
    engine: AsyncEngine, jobs: int, versions: int, planner: PushPlanner | None, tokens: bool
) -> tuple[float, float, int]:
    runs = []
    for _ in range(jobs):
        job_id, user_id = str(uuid.uuid4()), f"user-{uuid.uuid4().hex[:8]}"
        if tokens:
            await register(engine, user_id, job_id)
        runs.append(run_of(job_id, user_id, versions))
    projection = ProjectionStore(engine)
    calls = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(versions):
        for run in runs:
            await projection.apply([run[step]], planner)
            calls += 1
    return time.process_time() - cpu, time.perf_counter() - wall, calls


async def measure(url: str, jobs: int, versions: int) -> None:
    engine = create_async_engine(asyncpg_url(url), pool_size=2)
    planner = PushPlanner(Rules(timedelta(seconds=5), timedelta(minutes=15)))
    try:
        await mode(engine, 20, 3, planner, True)  # warm up
        results = {
            "apply only (anchor)": await mode(engine, jobs, versions, None, False),
            "apply + planning, no tokens": await mode(engine, jobs, versions, planner, False),
            "apply + planning, device + activity": await mode(
                engine, jobs, versions, planner, True
            ),
        }
        async with engine.connect() as connection:
            pushes = (await connection.execute(text("SELECT count(*) FROM notify.pushes"))).scalar()
    finally:
        await engine.dispose()
    anchor_cpu, anchor_wall, _ = results["apply only (anchor)"]
    anchor_cpu /= jobs * versions
    anchor_wall /= jobs * versions
    print(f"{jobs} jobs x {versions} versions, one state per apply; pushes recorded: {pushes}")
    for name, (cpu, wall, calls) in results.items():
        cpu_op, wall_op = cpu / calls * 1e6, wall / calls * 1e6
        print(
            f"  {name:38} cpu {cpu_op:7.0f} µs/apply ({cpu_op / (anchor_cpu * 1e6):.2f}x)"
            f"  wall {wall_op:7.0f} µs/apply ({wall_op / (anchor_wall * 1e6):.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    args = parser.parse_args()
    name = f"bench_push_planning_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(args.database_url, name)
    try:
        migrations.upgrade("notify", url)
        asyncio.run(measure(url, args.jobs, args.versions))
    finally:
        postgres.drop_database(args.database_url, name)


if __name__ == "__main__":
    main()
