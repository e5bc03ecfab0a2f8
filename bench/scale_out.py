"""Scale-out on one machine: jobs through the edge with 1 and with 2 processes of each kind
(creation's API, creation's workers, media, notify) on one PostgreSQL and one Redis, Envoy
balancing over them (services.dev.fleet).

The clients are the acceptance test's (tests/support/scale_out.py), as the app behaves:
``--users`` users each keep ``--in-flight`` jobs going — submit over HTTP/JSON with an
Idempotency-Key, follow it on a WatchJobs stream (half the users over gRPC, half over
HTTP/JSON) and with a read of the job every 0.3 s, then read it and download its picture
through the edge. The stub provider finishes a job on its first poll. After a warm-up of
``--warm-up`` jobs, ``--jobs`` are measured: jobs/s, and CPU per job of each kind of
process, Envoy, PostgreSQL's backends and the clients (one Python process). Before the
load, ``--idle`` seconds of CPU with the streams open and nothing moving are printed too.

With ``--kill``, the 2-replica run goes on: one replica of each kind is killed (SIGKILL),
and the jobs/s after it (once the jobs in flight at the kill have finished) is printed
beside the time that took.

    .venv/bin/python bench/scale_out.py [--replicas 1 2] [--users 16] [--in-flight 3]
        [--warm-up 60] [--jobs 400] [--kill] [--idle 5] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import distinct, func, select
from sqlalchemy.ext.asyncio import create_async_engine

from bench.cpu import CpuMeter
from bench.scratch import scratch_folder
from bench.submit_throughput import postgres_backends
from services.creation.domain import Status
from services.creation.tables import jobs
from services.dev import postgres
from services.dev.fleet import KINDS, Fleet
from services.kit import migrations
from services.kit.db import asyncpg_url
from tests.support.scale_out import Load, fleet_env

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def meter(fleet: Fleet, database: str) -> CpuMeter:
    groups = {kind: (lambda kind=kind: fleet.pids(kind)) for kind in KINDS}
    return CpuMeter(
        {
            **groups,
            "envoy": lambda: [fleet.envoy.process.pid] if fleet.envoy else [],
            "postgresql": lambda: postgres_backends(database),
            "clients": lambda: [os.getpid()],
        }
    )


async def every_worker_busy(fleet: Fleet) -> None:
    """Returns once each worker process holds a RUNNING job."""
    engine = create_async_engine(asyncpg_url(fleet.database_url))
    query = select(func.count(distinct(jobs.c.lease_owner))).where(
        jobs.c.status == Status.RUNNING.value
    )
    try:
        async with asyncio.timeout(120):
            while True:
                async with engine.connect() as connection:
                    if (await connection.execute(query)).scalar_one() >= fleet.replicas:
                        return
                await asyncio.sleep(0.01)
    finally:
        await engine.dispose()


async def measure(fleet: Fleet, database: str, args: argparse.Namespace) -> None:
    load = Load(fleet.edge_url, fleet.edge_address, users=args.users, in_flight=args.in_flight)
    try:
        await load.prepare()
        # What the processes cost doing nothing (polls, reapers, relays, backstops): CPU
        # per second with the streams open and no job moving.
        idle = meter(fleet, database)
        idle.start()
        await asyncio.sleep(args.idle)
        at_rest = idle.per_op(1)
        print(
            f"{fleet.replicas} replica(s) of each kind, idle: CPU ms/s "
            + ", ".join(f"{name} {ms / args.idle:.1f}" for name, ms in at_rest.items())
            + f" (total {sum(at_rest.values()) / args.idle:.1f})"
        )
        load.start()
        await load.completions(args.warm_up, within=300)
        cpu = meter(fleet, database)
        cpu.start()
        await load.completions(args.warm_up + args.jobs, within=600)
        rate = load.rate(args.warm_up, args.warm_up + args.jobs)
        spent = cpu.per_op(args.jobs)
        print(f"{fleet.replicas} replica(s) of each kind: {rate:.1f} jobs/s")
        print(
            "  CPU ms/job: "
            + ", ".join(f"{name} {ms:.1f}" for name, ms in spent.items())
            + f" (total {sum(spent.values()):.1f})"
        )
        if args.kill and fleet.replicas > 1:
            # Killed while every worker holds running jobs: the dead one's must come back.
            await every_worker_busy(fleet)
            unfinished = load.unfinished()
            for kind in KINDS:
                fleet.kill(kind, 0)
            killed_at = time.monotonic()
            await load.all_finished(unfinished, within=120)
            recovered_in = time.monotonic() - killed_at
            counted = len(load.completed)
            await load.completions(counted + args.jobs, within=600)
            after = load.rate(counted, counted + args.jobs)
            print(
                f"  one of each kind killed: the {len(unfinished)} jobs in flight finished "
                f"within {recovered_in:.1f} s; then {after:.1f} jobs/s"
            )
        await load.finish(within=120)
        print(f"  errors the clients saw: {dict(load.errors.summary()) or 'none'}")
    finally:
        await load.close()


def run(admin: str, redis_url: str, replicas: int, args: argparse.Namespace) -> None:
    work = scratch_folder(f"atelier-scale-{replicas}-")
    name = f"atelier_scale_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(admin, name)
    fleet = Fleet(
        database_url=url,
        redis_url=redis_url,
        work_dir=work,
        replicas=replicas,
        extra_env={**fleet_env(0), "ATELIER_LOG_LEVEL": "WARNING"},
    )
    try:
        for service in ("creation", "media", "notify"):
            migrations.upgrade(service, url)
        fleet.start()
        asyncio.run(measure(fleet, name, args))
    finally:
        fleet.stop()
        postgres.drop_database(admin, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=3)
    parser.add_argument("--warm-up", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle measured")
    parser.add_argument("--database-url", help="an admin URL; default: the local one")
    parser.add_argument(
        "--redis-url", default=os.environ.get("ATELIER_TEST_REDIS_URL") or LOCAL_REDIS
    )
    args = parser.parse_args()
    admin = args.database_url or os.environ.get("ATELIER_TEST_POSTGRES_URL") or LOCAL_POSTGRES
    print(
        f"{args.users} users x {args.in_flight} jobs in flight; "
        f"{args.warm_up} jobs warm-up, {args.jobs} measured"
    )
    for replicas in args.replicas:
        run(admin, args.redis_url, replicas, args)


if __name__ == "__main__":
    main()
