"""How long a submitted job waits before a worker claims it, at a steady 20 jobs/s.

A real ``Worker`` runs in its own process on a throwaway database (the in-memory provider
and media stand-ins of engine_drain, so the jobs end at once and every claim finds a free
slot), with its fallback poll set to a minute: a job is picked up through the NOTIFY its
submit commits, or late. This process submits jobs (the store's submit, one fresh user
each) on a fixed schedule; the worker prints the wall-clock time at which each claim
returned. Latency = claim returned - submit returned (the submit's commit, which sends the
NOTIFY, is done by then). Printed: p50, p99, max, beside the anchor measured in the same
run on the same schedule: a process with a bare asyncpg LISTEN connection that claims
with one plain UPDATE when notified.

    .venv/bin/python bench/pickup_latency.py [--jobs 600] [--rate 20] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_drain import (
    ExistingOutputMedia,
    InstantProvider,
    on_services_loop,
    quiet_logging,
    without_media,
)
from services.creation.domain import Job
from services.creation.media_client import MediaClient
from services.creation.providers.base import Provider
from services.creation.settings import CreationSettings
from services.creation.store import jobs as store
from services.creation.store.jobs import SubmitLimits
from services.creation.store.leases import QUEUED_CHANNEL
from services.creation.submission import SubmitCommand
from services.creation.worker.loop import Worker
from services.dev import postgres
from services.kit import migrations
from services.kit.db import Database
from services.kit.listen import asyncpg_dsn

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LIMITS = SubmitLimits(daily_quota=1000, in_flight_limit=1000, max_attempts=3, welcome_points=100)


class TimedWorker(Worker):
    """Prints ``job_id wall-clock`` as each claim returns."""

    async def _claim(self, limit: int) -> list[Job]:
        claimed = await super()._claim(limit)
        now = time.time()
        for job in claimed:
            print(f"claimed {job.job_id} {now:.6f}", flush=True)
        return claimed


async def worker(url: str) -> None:
    settings = CreationSettings.from_env(
        {
            "ATELIER_DATABASE_URL": url,
            "ATELIER_WORKER_CONCURRENCY": "64",
            "ATELIER_WORKER_POLL": "60",
        }
    )
    database = Database(url, "bench-pickup", limits=settings.common.database)
    providers: dict[str, Provider] = {"stub": InstantProvider()}
    running = without_media(
        TimedWorker(database.engine, cast(MediaClient, ExistingOutputMedia()), providers, settings)
    )
    task = asyncio.create_task(running.run())
    await asyncio.sleep(1)  # the listener is connected by now
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await running.stop(asyncio.get_running_loop().time() + 5)
    await task
    await database.close()


async def submit_steadily(url: str, jobs: int, rate: float) -> dict[str, float]:
    """Submits ``jobs`` at ``rate`` per second; the wall-clock time each submit returned."""
    database = Database(url, "bench-pickup-submit")
    returned: dict[str, float] = {}
    command = SubmitCommand(
        idempotency_key=None,
        model_id="stub-fast",
        style_id="natural",
        input_asset_id="5f0c1b8e-0000-4000-8000-000000000002",
        prompt="bench",
        negative_prompt="",
        width=512,
        height=512,
        parameters={},
    )
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    try:
        for n in range(jobs):
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
            done = await store.submit(
                database.engine, f"pickup-{os.getpid()}-{n}", command, LIMITS, datetime.now(UTC)
            )
            returned[done.job.job_id] = time.time()
    finally:
        await database.close()
    return returned


def percentiles(values: list[float]) -> tuple[float, float, float]:
    cut = statistics.quantiles(values, n=100)
    return cut[49] * 1000, cut[98] * 1000, max(values) * 1000


def pickups(url: str, role: str, jobs: int, rate: float) -> tuple[list[float], int]:
    """Runs ``role`` (the worker, or the anchor) in its own process while jobs are
    submitted at ``rate``; each job's pickup latency, and how many were never claimed."""
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), role, "--database-url", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    for line in child.stdout:
        if line.strip() == "ready":
            break
    else:
        raise RuntimeError(f"the {role} did not start (its error is above)")
    claimed: dict[str, float] = {}

    def read_claims() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            kind, job_id, at = line.split()
            if kind == "claimed":
                claimed[job_id] = float(at)

    reader = threading.Thread(target=read_claims, daemon=True)
    reader.start()
    try:
        submitted = asyncio.run(submit_steadily(url, jobs, rate))
        time.sleep(1)
    finally:
        child.stdin.write("stop\n")
        child.stdin.close()
        child.wait(timeout=30)
        reader.join(timeout=5)
    latencies = [claimed[j] - t for j, t in submitted.items() if j in claimed]
    return latencies, len(submitted) - len(latencies)


async def anchor(url: str) -> None:
    """The plainest pickup: a raw asyncpg connection LISTENs on the queued channel and,
    on each notification, claims what is due with one bare UPDATE."""
    listening = await asyncpg.connect(asyncpg_dsn(url))
    claiming = await asyncpg.connect(asyncpg_dsn(url))
    woken = asyncio.Event()
    await listening.add_listener(QUEUED_CHANNEL, lambda *_: woken.set())
    claim = """
        UPDATE creation.jobs SET status = 'running', step = 'preparing', attempt = 1,
               lease_owner = 'anchor', lease_epoch = lease_epoch + 1,
               lease_expires_at = now() + interval '1 hour', started_at = now(),
               version = version + 1, updated_at = now()
        WHERE job_id IN (SELECT job_id FROM creation.jobs
                         WHERE status = 'queued' AND next_attempt_at <= now()
                         ORDER BY priority DESC, next_attempt_at, created_at
                         LIMIT 16 FOR UPDATE SKIP LOCKED)
        RETURNING job_id"""

    async def claim_when_woken() -> None:
        while True:
            await woken.wait()
            woken.clear()
            rows = await claiming.fetch(claim)
            now = time.time()
            for row in rows:
                print(f"claimed {row['job_id']} {now:.6f}", flush=True)

    task = asyncio.create_task(claim_when_woken())
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    task.cancel()
    await listening.close()
    await claiming.close()


def run(admin_url: str, jobs: int, rate: float) -> None:
    name = f"bench_pickup_{os.getpid()}"
    url = postgres.ensure_database(admin_url, name)
    try:
        migrations.upgrade("creation", url)
        print(f"{jobs} jobs at {rate:g}/s; the worker: one process, fallback poll 60 s")
        print("pickup = claim returned - submit returned")
        figures = {}
        for role in ("anchor", "worker"):
            latencies, missing = pickups(url, role, jobs, rate)
            figures[role] = percentiles(latencies)
            p50, p99, worst = figures[role]
            print(
                f"{role:<7} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max {worst:6.2f} ms"
                f"  never claimed: {missing}",
                flush=True,
            )
        ratios = [
            ours / raw for ours, raw in zip(figures["worker"], figures["anchor"], strict=True)
        ]
        print(f"ratio   worker / anchor: p50 {ratios[0]:.2f}, p99 {ratios[1]:.2f}")
    finally:
        postgres.drop_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "worker", "anchor"])
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    if args.role == "worker":
        quiet_logging()
        on_services_loop(worker(args.database_url))
        return
    if args.role == "anchor":
        on_services_loop(anchor(args.database_url))
        return
    run(args.database_url, args.jobs, args.rate)


if __name__ == "__main__":
    main()
