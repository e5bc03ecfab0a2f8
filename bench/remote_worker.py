"""Jobs/s through the remote worker protocol beside the in-process engine, in the same
run: a stack of its own (creation's API, media, notify, Envoy) on a throwaway database;
``--jobs`` jobs queued, then drained by one in-process worker process (`atelier serve
creation --role worker`), then another ``--jobs`` by one remote worker process
(`atelier worker --remote`), each with the zero-latency stub (done on its first poll) and
``--concurrency`` jobs at once. The rate is read from the jobs' own events: from the
first claim to the last completion.

    .venv/bin/python bench/remote_worker.py [--jobs 400] [--concurrency 16]
        [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.tables import job_events
from services.dev import postgres
from services.dev.stack import Stack, StackPorts
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.remote_workers import pools_setting, start_remote_worker
from tests.support.workers import (
    WorkerProcess,
    all_finished,
    new_user,
    queue_jobs,
    start_worker,
)

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
PER_USER = 20  # 100 welcome points at a price of 5


async def rate(db: AsyncEngine, job_ids: list[str]) -> float:
    """Jobs per second from the first claim to the last completion of ``job_ids``."""
    async with db.connect() as connection:
        first, last = (
            await connection.execute(
                select(
                    func.min(job_events.c.created_at).filter(job_events.c.to_status == "running"),
                    func.max(job_events.c.created_at).filter(job_events.c.to_status == "succeeded"),
                ).where(job_events.c.job_id.in_(job_ids))
            )
        ).one()
    return len(job_ids) / max(1e-6, (last - first).total_seconds())


async def drain(stack: Stack, db: AsyncEngine, jobs: int, start: object) -> float:
    users = [new_user("bench") for _ in range(max(1, jobs // PER_USER))]
    inputs = await asyncio.gather(*(put_input(stack, user) for user in users))
    queued = await queue_jobs(db, dict(zip(users, inputs, strict=True)), min(PER_USER, jobs))
    job_ids = [q.job_id for q in queued]
    worker: WorkerProcess = start()  # type: ignore[operator]
    try:
        await all_finished(db, [worker], within=600, job_ids=job_ids)
    finally:
        worker.stop()
    return await rate(db, job_ids)


async def run(stack: Stack, jobs: int, concurrency: int) -> None:
    db = create_async_engine(asyncpg_url(stack.database_url))
    stub = {"ATELIER_STUB_DURATION": "0", "ATELIER_STUB_LATENCY": "0"}
    try:
        in_process = await drain(
            stack,
            db,
            jobs,
            lambda: start_worker(
                stack,
                "bench-in-process",
                {
                    **stub,
                    "ATELIER_WORKER_CONCURRENCY": str(concurrency),
                    "ATELIER_WORKER_PROVIDER_POLL": "0.01",
                },
            ),
        )
        remote = await drain(
            stack,
            db,
            jobs,
            lambda: start_remote_worker(
                stack,
                "bench-remote",
                {
                    **stub,
                    "ATELIER_REMOTE_WORKER_CONCURRENCY": str(concurrency),
                    "ATELIER_REMOTE_WORKER_POLL": "0.01",
                    "ATELIER_REMOTE_WORKER_PROVIDER_POLL": "0.01",
                },
            ),
        )
    finally:
        await db.dispose()
    print(f"in-process worker: {in_process:7.1f} jobs/s  ({jobs} jobs, concurrency {concurrency})")
    print(f"remote worker:     {remote:7.1f} jobs/s  ({jobs} jobs, concurrency {concurrency})")
    print(f"remote / in-process: {remote / in_process:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    args = parser.parse_args()
    name = f"atelier_bench_remote_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(args.database_url, name)
    with tempfile.TemporaryDirectory() as work:
        stack = Stack(
            database_url=url,
            ports=StackPorts.free(),
            work_dir=Path(work),
            log_dir=Path(work) / "logs",
            creation_role="api",
            extra_env={"ATELIER_ENV": "test", "ATELIER_REMOTE_POOLS": pools_setting()},
        )
        try:
            stack.migrate()
            stack.start()
            asyncio.run(run(stack, args.jobs, args.concurrency))
        finally:
            stack.stop()
            postgres.drop_database(args.database_url, name)


if __name__ == "__main__":
    main()
