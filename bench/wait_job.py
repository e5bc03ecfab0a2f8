"""What WaitJob costs a job's path: the engine drain with and without an API process
holding waits, alternated round by round.

Each round queues ``--jobs`` jobs in a throwaway database and lets one real ``Worker``
process drain them (engine_drain's engine: in-memory provider, media stand-in). In the
"waits" runs an API-side process runs creation's ``JobWaits`` component (one LISTEN on
``creation_outbox``) with ``--held`` waits that never end (ids of no job: every wake
reads them all, as waits on long jobs would) and ``--tracked`` waits on jobs of the
drained queue, whose wake-up it times: event set - the job's completed_at (the completing
transaction's start, so the figure includes that transaction). Every job change the worker
commits NOTIFYs, so the component is woken all through the drain.

Printed per run: jobs/s, worker and PostgreSQL CPU per job (PostgreSQL: every backend of
the database, the waiter's included); for the waits runs the waiter's CPU, its checks
(statements) and the wake latency; then the medians and the ratio waits / alone.

    .venv/bin/python bench/wait_job.py [--jobs 20000] [--rounds 3] [--held 200]
        [--tracked 200] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_drain import (
    LOCAL_POSTGRES,
    Figure,
    cpu_seconds,
    drain_with,
    on_services_loop,
    queue_jobs,
    quiet_logging,
    start,
    stop,
)
from services.creation.waits import JobWaits
from services.dev import postgres
from services.kit import migrations
from services.kit.db import Database
from services.kit.listen import asyncpg_dsn


async def waiter(url: str, held: int, tracked: int) -> None:
    """The API side: the component, ``held`` endless waits and ``tracked`` timed ones."""
    database = Database(url, "bench-waits")
    waits = JobWaits(database.engine, url)
    running = asyncio.create_task(waits.run())
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT job_id::text FROM creation.jobs ORDER BY random() LIMIT $1", tracked
        )
    finally:
        await connection.close()
    woke: dict[str, float] = {}

    async def timed(job_id: str) -> None:
        with waits.watching(job_id) as settled:
            await settled.wait()
            woke[job_id] = time.time()

    async def endless(job_id: str) -> None:
        with waits.watching(job_id) as settled:
            await settled.wait()

    tasks = [asyncio.create_task(timed(r["job_id"])) for r in rows]
    tasks += [asyncio.create_task(endless(str(uuid.uuid4()))) for _ in range(held)]
    await asyncio.wait_for(waits.listener.connected.wait(), 10)
    await asyncio.sleep(0.2)
    checks = waits.checks
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    checks = waits.checks - checks
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        done = await connection.fetch(
            "SELECT job_id::text, extract(epoch FROM completed_at)::float8 AS at"
            " FROM creation.jobs WHERE job_id = ANY($1::uuid[])",
            list(woke),
        )
    finally:
        await connection.close()
    latencies = sorted((woke[r["job_id"]] - r["at"]) * 1000 for r in done if r["at"])
    await waits.stop(asyncio.get_running_loop().time() + 2)
    await running
    for task in tasks:
        task.cancel()
    await database.close()
    p50, p99 = _percentiles(latencies)
    print(f"report {checks} {len(latencies)} {p50:.2f} {p99:.2f}", flush=True)


def _percentiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cut = statistics.quantiles(values, n=100)
    return cut[49], cut[98]


def start_waiter(url: str, held: int, tracked: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "waiter",
            "--database-url",
            url,
            "--held",
            str(held),
            "--tracked",
            str(tracked),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError("the waiter did not start (its error is above)")
    return child


def stop_waiter(child: subprocess.Popen[str]) -> tuple[str, float]:
    assert child.stdin is not None
    assert child.stdout is not None
    cpu = cpu_seconds(child.pid)
    child.stdin.write("stop\n")
    child.stdin.close()
    line = child.stdout.readline().split()
    child.wait(timeout=30)
    checks, woken, p50, p99 = line[1:]
    return f"checks {checks}, woken {woken}, wake p50 {p50} ms p99 {p99} ms", cpu


def one_run(url: str, args: argparse.Namespace, with_waits: bool) -> Figure:
    queue_jobs(url, args.jobs)
    child = start_waiter(url, args.held, args.tracked) if with_waits else None
    engine = ["engine", "--database-url", url, "--concurrency", "256", "--claim-batch", "64"]
    workers = start(1, engine)
    try:
        time.sleep(0.5)
        cpu_before = cpu_seconds(child.pid) if child is not None else 0.0
        figure = asyncio.run(drain_with(url, args.jobs, workers))
    finally:
        stop(workers)
    line = (
        f"{'waits' if with_waits else 'alone':<6} {figure.jobs_per_second:8.0f} jobs/s"
        f"  worker CPU {figure.worker_cpu_ms:6.3f} ms/job"
        f"  PostgreSQL CPU {figure.database_cpu_ms:6.3f} ms/job"
    )
    if child is not None:
        said, cpu_after = stop_waiter(child)
        line += f"  waiter CPU {(cpu_after - cpu_before) / args.jobs * 1000:6.3f} ms/job; {said}"
    print(line, flush=True)
    return figure


def run(args: argparse.Namespace) -> None:
    database = f"bench_wait_{os.getpid()}"
    url = postgres.ensure_database(args.database_url, database)
    try:
        migrations.upgrade("creation", url)
        print(
            f"{args.jobs} queued jobs, one engine process; waits: {args.held} held +"
            f" {args.tracked} on drained jobs, in one API-side process; {args.rounds} rounds"
        )
        figures: dict[bool, list[Figure]] = {False: [], True: []}
        for round_ in range(args.rounds):
            # Alternated so that a machine slowing down or speeding up hurts both alike.
            for with_waits in (False, True) if round_ % 2 == 0 else (True, False):
                figures[with_waits].append(one_run(url, args, with_waits))

        def median(values: list[Figure], field: str) -> float:
            return statistics.median(getattr(f, field) for f in values)

        for field, name in (
            ("jobs_per_second", "jobs/s"),
            ("worker_cpu_ms", "worker CPU/job"),
            ("database_cpu_ms", "PostgreSQL CPU/job"),
        ):
            alone, waits = median(figures[False], field), median(figures[True], field)
            print(
                f"median {name:<19} alone {alone:9.3f}  waits {waits:9.3f}"
                f"  ratio waits / alone {waits / alone:.2f}",
                flush=True,
            )
    finally:
        postgres.drop_database(args.database_url, database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "waiter"])
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--held", type=int, default=200)
    parser.add_argument("--tracked", type=int, default=200)
    args = parser.parse_args()
    if args.role == "waiter":
        quiet_logging()
        on_services_loop(waiter(args.database_url, args.held, args.tracked))
        return
    run(args)


if __name__ == "__main__":
    main()
