"""What webhooks cost: deliveries per second of one deliverer process to a local
receiver, and the CPU a job's changes add when one endpoint is subscribed to every event,
beside the same job path with none, in one run.

    .venv/bin/python bench/webhooks.py [--deliveries 5000] [--jobs 500] [--rounds 10]
        [--database-url URL]

Against a throwaway database (creation's schema):

- **job path**: ``--jobs`` jobs each go through five versions as the services write them
  (the submit function; running; two progress updates; cancelled), one statement each on
  one connection, first with no endpoint, then with one endpoint subscribed to every event
  (the job change triggers mark each change's outbox row; five deliveries per job),
  ``--rounds`` times over, interleaved, each phase from an empty delivery table.
  Printed: CPU milliseconds per job of PostgreSQL (the backends serving the database) and
  of the writer (this process), medians, and what the endpoint adds: the median of each
  round's difference (its two phases ran back to back, so the machine's drift cancels).
  The deliverer does not run meanwhile: this is the cost on the job's own path. Then the
  **fan-out** of the marked changes to their deliveries, as the deliverers' rounds run
  it (creation.fan_out_webhooks in batches), off the job's path: CPU milliseconds per job.
- **delivery**: ``--deliveries`` pending deliveries of realistic jobs to one endpoint
  (max_in_flight 64) on a local receiver (its own process, HTTP/1.1 keep-alive, answering
  204), delivered by one deliverer (creation's component, in this process, on uvloop):
  deliveries per second (wall, and what the deliverer's CPU per delivery allows on one
  core) and CPU milliseconds per delivery of the deliverer, the receiver and PostgreSQL.

CPU time barely moves with the neighbours' load on a shared machine; wall time does.
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

from bench.cpu import CpuMeter
from bench.engine_drain import on_services_loop, quiet_logging
from bench.submit_throughput import postgres_backends
from services.creation.media_client import MediaClient
from services.creation.webhooks.deliverer import FAN_OUT_BATCH, WebhookDeliverer
from services.creation.webhooks.settings import WebhookSettings
from services.creation.webhooks.signing import new_secret
from services.dev import postgres
from services.kit import migrations
from services.kit.db import Database
from services.kit.listen import asyncpg_dsn
from services.kit.settings import DEV_SERVICE_TOKEN

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
EVERY_EVENT = [
    "job.queued",
    "job.running",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.needs_attention",
    "job.deleted",
    "job.progress",
]
SUBMIT = """
    SELECT submit_outcome FROM creation.submit_job(
      p_job_id => $2::uuid, p_user_id => $1, p_idempotency_key => NULL,
      p_model_id => 'stub-fast', p_style_id => 'watercolor',
      p_input_asset_id => gen_random_uuid(), p_prompt => 'a fox in the snow',
      p_negative_prompt => '', p_width => 512, p_height => 512,
      p_parameters => '{"seed": {"intValue": "42"}}', p_max_attempts => 3,
      p_request_hash => repeat('0', 64), p_day_start => now() - interval '1 day',
      p_daily_quota => 1000000, p_in_flight_limit => 1000000, p_welcome_points => 1000000000,
      p_now => now(), p_num_outputs => 1, p_trace_parent => NULL)
"""
CHANGES = (
    """UPDATE creation.jobs SET status = 'running', version = version + 1, attempt = 1,
        step = 'submitting', lease_owner = 'bench', lease_epoch = 1,
        lease_expires_at = now() + interval '1 minute', started_at = now()
       WHERE job_id = $1::uuid""",
    """UPDATE creation.jobs SET progress = 30, step = 'generating', version = version + 1
       WHERE job_id = $1::uuid""",
    """UPDATE creation.jobs SET progress = 60, version = version + 1 WHERE job_id = $1::uuid""",
    """UPDATE creation.jobs SET status = 'cancelled', version = version + 1,
        completed_at = now(), lease_owner = NULL, lease_expires_at = NULL
       WHERE job_id = $1::uuid""",
)
ENDPOINT = """
    INSERT INTO creation.webhook_endpoints (endpoint_id, url, event_types, secret,
        max_in_flight, created_by)
    VALUES ($1, $2, $3, $4, $5, 'bench')
"""
RESPONSE = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"


# --- the receiver (a process of its own) --------------------------------------------------


async def receive(port: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                writer.write(RESPONSE)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# --- the bench ----------------------------------------------------------------------------


async def job_path(dsn: str, database: str, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job of PostgreSQL and of this writer, over ``jobs`` jobs' five
    versions."""
    connection = await asyncpg.connect(dsn)
    try:
        meter = CpuMeter(
            {"postgres": lambda: postgres_backends(database), "writer": lambda: [os.getpid()]}
        )
        user = f"bench-{uuid.uuid4().hex[:8]}"
        wal = "SELECT pg_current_wal_insert_lsn()"
        meter.start()
        started_at = await connection.fetchval(wal)
        for _ in range(jobs):
            job_id = str(uuid.uuid4())
            await connection.fetchval(SUBMIT, user, job_id)
            for change in CHANGES:
                await connection.execute(change, job_id)
        spent = meter.per_op(jobs)
        # WAL is the cluster's: a clean figure needs a server of the bench's own.
        written = await connection.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", started_at
        )
        return {**spent, "wal": float(written) / jobs}
    finally:
        await connection.close()


async def fan_out(dsn: str, database: str, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job of PostgreSQL and of this caller to fan the marked job
    changes out to their deliveries, as a deliverer's rounds do (batches of its size)."""
    connection = await asyncpg.connect(dsn)
    try:
        meter = CpuMeter(
            {"postgres": lambda: postgres_backends(database), "caller": lambda: [os.getpid()]}
        )
        meter.start()
        while await connection.fetchval(
            "SELECT taken FROM creation.fan_out_webhooks($1)", FAN_OUT_BATCH
        ):
            pass
        return meter.per_op(jobs)
    finally:
        await connection.close()


async def delivery(
    dsn: str, url: str, database: str, receiver_pid: int, count: int, receiver_url: str
) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("DELETE FROM creation.webhook_endpoints")
        endpoint_id = str(uuid.uuid4())
        await connection.execute(
            ENDPOINT, endpoint_id, receiver_url, ["job.queued"], new_secret(), 64
        )
        # A realistic payload: a job's, kept by a row marked while the endpoint was on.
        payload = await connection.fetchval(
            "SELECT payload::text FROM creation.outbox WHERE payload IS NOT NULL"
            " ORDER BY outbox_id DESC LIMIT 1"
        )
        settings = WebhookSettings(
            batch=200,
            concurrency=256,
            allow_http=True,
            allowed_networks=("127.0.0.1/32",),
            poll_seconds=0.5,
        )
        database_ = Database(url, "bench-webhooks")
        media = MediaClient("127.0.0.1:9", DEV_SERVICE_TOKEN)  # no outputs to sign
        deliverer = WebhookDeliverer(database_.engine, media, settings, url)
        running = asyncio.create_task(deliverer.run())
        await deliverer.listener.connected.wait()
        meter = CpuMeter(
            {
                "deliverer": lambda: [os.getpid()],
                "receiver": lambda: [receiver_pid],
                "postgres": lambda: postgres_backends(database),
            }
        )
        meter.start()
        started = time.perf_counter()
        await connection.execute(
            "INSERT INTO creation.webhook_deliveries (endpoint_id, job_id, user_id,"
            " job_version, event_type, payload, occurred_at)"
            " SELECT $1, gen_random_uuid(), 'bench', 1, 'job.queued', $2::jsonb, now()"
            " FROM generate_series(1, $3)",
            endpoint_id,
            payload,
            count,
        )
        done = "SELECT count(*) FROM creation.webhook_deliveries WHERE state = 'succeeded'"
        deadline = time.monotonic() + 600
        while await connection.fetchval(done) < count:
            if time.monotonic() > deadline:
                raise TimeoutError("the deliverer left deliveries pending")
            await asyncio.sleep(0.02)
        wall = time.perf_counter() - started
        spent = meter.per_op(count)
        await deliverer.stop(asyncio.get_running_loop().time() + 5)
        await running
        await media.close()
        await database_.close()
        print(
            f"delivery: {count} deliveries in {wall:.2f} s = {count / wall:,.0f}/s per process"
            f" (target >= 1,000; CPU-bound, one core: {1000 / spent['deliverer']:,.0f}/s);"
            " CPU ms per delivery: " + ", ".join(f"{name} {ms:.3f}" for name, ms in spent.items()),
            flush=True,
        )
    finally:
        await connection.close()


async def bench(
    args: argparse.Namespace, url: str, database: str, receiver_pid: int, port: int
) -> None:
    dsn = asyncpg_dsn(url)
    receiver_url = f"http://127.0.0.1:{port}/hooks"
    connection = await asyncpg.connect(dsn)
    try:
        figures: dict[str, list[dict[str, float]]] = {"none": [], "one": [], "fan-out": []}
        await job_path(dsn, database, max(10, args.jobs // 10))  # warm up
        for _ in range(args.rounds):
            # Each phase starts from an empty delivery table (its growth is not the
            # endpoint's cost; pruning keeps it bounded in production).
            await connection.execute("DELETE FROM creation.webhook_endpoints")
            await connection.execute("TRUNCATE creation.webhook_deliveries")
            figures["none"].append(await job_path(dsn, database, args.jobs))
            await connection.execute(
                ENDPOINT, str(uuid.uuid4()), receiver_url, EVERY_EVENT, new_secret(), 8
            )
            figures["one"].append(await job_path(dsn, database, args.jobs))
            figures["fan-out"].append(await fan_out(dsn, database, args.jobs))
    finally:
        await connection.close()

    def median(phase: str, group: str) -> float:
        return statistics.median(f[group] for f in figures[phase])

    # Each round's difference (its two phases ran back to back: the machine's drift
    # cancels).
    added = [
        one["postgres"] + one["writer"] - none["postgres"] - none["writer"]
        for none, one in zip(figures["none"], figures["one"], strict=True)
    ]
    print(
        f"job path (5 versions a job, {args.jobs} jobs a phase, {args.rounds} rounds):"
        f" CPU ms per job, medians: no endpoint PostgreSQL {median('none', 'postgres'):.3f}"
        f" + writer {median('none', 'writer'):.3f}; one endpoint on every event PostgreSQL"
        f" {median('one', 'postgres'):.3f} + writer {median('one', 'writer'):.3f};"
        f" added per job {statistics.median(added):.3f} (target <= 0.3; each round's:"
        f" {_listed(added)})",
        flush=True,
    )
    # Load-independent: what the job's statements write, in bytes of WAL (the whole
    # server's: pass --database-url of a server of the bench's own for a clean figure).
    print(
        f"job path WAL bytes per job, medians: no endpoint {median('none', 'wal'):,.0f};"
        f" one endpoint on every event {median('one', 'wal'):,.0f}",
        flush=True,
    )
    # Off the job's path: the deliverers' batches (their cost per delivery beside it).
    print(
        f"fan-out (by the deliverers, 5 deliveries a job): CPU ms per job, medians:"
        f" PostgreSQL {median('fan-out', 'postgres'):.3f}"
        f" + caller {median('fan-out', 'caller'):.3f}",
        flush=True,
    )
    await delivery(dsn, url, database, receiver_pid, args.deliveries, receiver_url)


def _listed(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "receiver"])
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.role == "receiver":
        on_services_loop(receive(0))
        return
    quiet_logging()
    database = f"bench_webhooks_{os.getpid()}"
    url = postgres.ensure_database(args.database_url, database)
    receiver = subprocess.Popen(
        [sys.executable, "-m", "bench.webhooks", "receiver"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        migrations.upgrade("creation", url)
        on_services_loop(bench(args, url, database, receiver.pid, port))
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
        postgres.drop_database(args.database_url, database)


if __name__ == "__main__":
    main()
