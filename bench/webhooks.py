"""What webhooks cost: deliveries per second of one deliverer process to a local
receiver, and the CPU a job's changes add when one endpoint is subscribed to every event,
beside the same job path with none, in one run.

    .venv/bin/python bench/webhooks.py [--deliveries 5000] [--jobs 250] [--rounds 4]
        [--database-url URL]

Against a throwaway database (creation's schema) on a PostgreSQL of the bench's own
(embedded, services.dev.postgres.start_embedded; ``--database-url`` names another
server instead, whose other writers then count in the WAL figures):

- **job path**: jobs each go through five versions as the services write them (the
  submit function; running; two progress updates; cancelled), one statement each on one
  connection, in pairs: one job with no endpoint enabled and one with an endpoint
  subscribed to every event (the job change triggers mark each change's outbox row; five
  deliveries per job), the endpoint toggled between them and the pair's order
  alternating; ``--rounds`` rounds of ``--jobs`` pairs. Measured per job: the CPU of the
  one backend serving the job's statements (the scheduler's nanoseconds,
  /proc/<pid>/sched) and of the writer's thread, so autovacuum, other backends and other
  sessions' processes never count; and the WAL the statements wrote. The machine's
  speed drifts by tens of percent within seconds when it is shared; both jobs of a pair
  see the same. Printed: medians of the rounds per job, and what the endpoint adds: the
  mean of the pairs' differences with its standard error, and the rounds' spread. The
  deliverer does not run meanwhile: this is the cost on the job's own path. After each
  round, the **fan-out** of its marked changes to their deliveries, as the deliverers'
  rounds run it (creation.fan_out_webhooks in batches), off the job's path: CPU
  milliseconds and WAL bytes per job.
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
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cpu import CpuMeter, cpu_seconds
from bench.engine_drain import on_services_loop, quiet_logging
from bench.scratch import scratch_folder
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


def backend_seconds(pid: int) -> float:
    """CPU time a PostgreSQL backend (one thread) has run, in seconds, from the scheduler's
    own count (/proc/<pid>/sched, nanoseconds) where the kernel shows it, else its ticks
    (/proc/<pid>/stat, 10 ms)."""
    try:
        with open(f"/proc/{pid}/sched", encoding="ascii") as sched:
            for line in sched:
                if line.startswith("se.sum_exec_runtime"):
                    return float(line.split(":")[1]) / 1000
    except OSError:
        pass
    return cpu_seconds(pid)


class Phase:
    """One connection, and the CPU of the one backend serving it and of this thread: a
    block of work measured on it excludes every other process (autovacuum, the neighbours'
    backends, the bench's own bookkeeping)."""

    def __init__(self, connection: asyncpg.Connection, backend: int) -> None:
        self.connection = connection
        self.backend = backend

    async def measure(self, work: Callable[[], Awaitable[None]], count: int) -> dict[str, float]:
        """CPU ms per item of the backend and of the writer (this thread), and WAL bytes
        per item (the whole server's: a clean figure needs a server of the bench's own)."""
        wal = await self.connection.fetchval("SELECT pg_current_wal_insert_lsn()")
        backend, writer = backend_seconds(self.backend), time.thread_time()
        await work()
        writer, backend = time.thread_time() - writer, backend_seconds(self.backend) - backend
        written = await self.connection.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", wal
        )
        return {
            "postgres": backend * 1000 / count,
            "writer": writer * 1000 / count,
            "wal": float(written) / count,
        }


async def job_path(phase: Phase, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job of the backend and of this writer, and WAL bytes per job,
    over ``jobs`` jobs' five versions."""
    user = f"bench-{uuid.uuid4().hex[:8]}"

    async def write() -> None:
        for _ in range(jobs):
            job_id = str(uuid.uuid4())
            await phase.connection.fetchval(SUBMIT, user, job_id)
            for change in CHANGES:
                await phase.connection.execute(change, job_id)

    return await phase.measure(write, jobs)


async def fan_out(phase: Phase, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job of the backend and of this caller to fan the marked job
    changes out to their deliveries, as a deliverer's rounds do (batches of its size)."""

    async def run() -> None:
        while await phase.connection.fetchval(
            "SELECT taken FROM creation.fan_out_webhooks($1)", FAN_OUT_BATCH
        ):
            pass

    return await phase.measure(run, jobs)


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
        # A realistic payload: the message of a job the job path wrote.
        payload = await connection.fetchval(
            "SELECT creation.job_message(j)::text FROM creation.jobs AS j"
            " ORDER BY created_at DESC LIMIT 1"
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
        # The deliverer's own count of recorded outcomes (a query every few ms would load
        # PostgreSQL and this process with the bench's own bookkeeping).
        deadline = time.monotonic() + 600
        while deliverer.recorded < count:
            if time.monotonic() > deadline:
                raise TimeoutError("the deliverer left deliveries pending")
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - started
        spent = meter.per_op(count)
        done = "SELECT count(*) FROM creation.webhook_deliveries WHERE state = 'succeeded'"
        succeeded = await connection.fetchval(done)
        if succeeded != count:
            raise RuntimeError(f"{succeeded} of {count} deliveries succeeded")
        opened = getattr(deliverer._client, "connections_opened", 0)
        await deliverer.stop(asyncio.get_running_loop().time() + 5)
        await running
        await media.close()
        await database_.close()
        print(
            f"delivery: {count} deliveries in {wall:.2f} s = {count / wall:,.0f}/s per process"
            f" (target >= 1,000; CPU-bound, one core: {1000 / spent['deliverer']:,.0f}/s);"
            " CPU ms per delivery: "
            + ", ".join(f"{name} {ms:.3f}" for name, ms in spent.items())
            + f"; connections opened {opened}",
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
        phase = Phase(connection, await connection.fetchval("SELECT pg_backend_pid()"))
        figures: dict[str, list[dict[str, float]]] = {"none": [], "one": [], "fan-out": []}
        # Each pair's difference, one endpoint less none: CPU ms.
        pairs: list[float] = []
        await connection.execute("DELETE FROM creation.webhook_endpoints")
        await connection.execute(
            ENDPOINT, str(uuid.uuid4()), receiver_url, EVERY_EVENT, new_secret(), 8
        )
        toggle = (
            "UPDATE creation.webhook_endpoints SET enabled = $1,"
            " disabled_reason = CASE WHEN $1 THEN '' ELSE 'operator' END"
        )
        for enabled in (False, True):  # warm up both paths
            await connection.execute(toggle, enabled)
            await job_path(phase, max(10, args.jobs // 5))
        await fan_out(phase, 1)
        for _ in range(args.rounds):
            # Job by job, the endpoint enabled for one of each pair and not for the other,
            # in alternating order (none, one; one, none; ...): the machine's speed, which
            # drifts by tens of percent within seconds on a shared machine, is the same for
            # both jobs of a pair, so each pair's difference is the endpoint's.
            sums = {name: {"postgres": 0.0, "writer": 0.0, "wal": 0.0} for name in ("none", "one")}
            for pair in range(args.jobs):
                measured: dict[str, dict[str, float]] = {}
                for name in ("none", "one") if pair % 2 == 0 else ("one", "none"):
                    await connection.execute(toggle, name == "one")
                    measured[name] = await job_path(phase, 1)
                    for group, value in measured[name].items():
                        sums[name][group] += value / args.jobs
                pairs.append(
                    sum(measured["one"][g] - measured["none"][g] for g in ("postgres", "writer"))
                )
            figures["none"].append(sums["none"])
            figures["one"].append(sums["one"])
            figures["fan-out"].append(await fan_out(phase, args.jobs))
            # The deliveries' growth is not the next round's cost (pruning keeps the table
            # bounded in production).
            await connection.execute("TRUNCATE creation.webhook_deliveries")
    finally:
        await connection.close()

    def median(phase: str, group: str) -> float:
        return statistics.median(f[group] for f in figures[phase])

    # Each round's difference, and the mean of the pairs' with its standard error: the
    # target is met when the mean is below it by more than two standard errors.
    added = [
        one["postgres"] + one["writer"] - none["postgres"] - none["writer"]
        for none, one in zip(figures["none"], figures["one"], strict=True)
    ]
    mean = statistics.fmean(pairs)
    error = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else float("nan")
    print(
        f"job path (5 versions a job, {args.rounds} rounds of {args.jobs} pairs of jobs, one"
        " with no endpoint enabled and one with an endpoint on every event, in alternating"
        " order): CPU ms per job of the backend serving the job's statements and of the"
        f" writer, medians of rounds: no endpoint PostgreSQL {median('none', 'postgres'):.3f}"
        f" + writer {median('none', 'writer'):.3f}; one endpoint PostgreSQL"
        f" {median('one', 'postgres'):.3f} + writer {median('one', 'writer'):.3f};"
        f" added per job: mean {mean:.3f} ± {error:.3f} (standard error of {len(pairs)}"
        f" pairs; target <= 0.3); rounds {_spread(added)}",
        flush=True,
    )
    # Load-independent: what the job's statements write, in bytes of WAL (the whole
    # server's: pass --database-url of a shared server and neighbours' writes count).
    print(
        f"job path WAL bytes per job, medians: no endpoint {median('none', 'wal'):,.0f};"
        f" one endpoint on every event {median('one', 'wal'):,.0f}",
        flush=True,
    )
    # Off the job's path: the deliverers' batches (their cost per delivery beside it).
    print(
        f"fan-out (by the deliverers, 5 deliveries a job): CPU ms per job, medians:"
        f" PostgreSQL {median('fan-out', 'postgres'):.3f}"
        f" + caller {median('fan-out', 'writer'):.3f}; WAL bytes per job"
        f" {median('fan-out', 'wal'):,.0f}",
        flush=True,
    )
    await delivery(dsn, url, database, receiver_pid, args.deliveries, receiver_url)


def _spread(values: list[float]) -> str:
    """The lowest, the quartiles and the highest."""
    if len(values) < 4:
        return " ".join(f"{v:.3f}" for v in values)
    low, middle, high = statistics.quantiles(values, n=4)
    return f"{min(values):.3f} / {low:.3f} / {middle:.3f} / {high:.3f} / {max(values):.3f}"


def own_server() -> str:
    """An embedded PostgreSQL of the bench's own (gone when the bench exits), its
    checkpoints spaced past the run: a checkpoint in one phase would load that phase
    alone with the full-page images of every page it touches first."""
    admin_url = postgres.start_embedded(scratch_folder("atelier-bench-") / "pg")

    async def configure() -> None:
        connection = await asyncpg.connect(**postgres.connect_kwargs(admin_url))
        try:
            await connection.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
            await connection.execute("ALTER SYSTEM SET max_wal_size = '16GB'")
            await connection.execute("SELECT pg_reload_conf()")
        finally:
            await connection.close()

    asyncio.run(configure())
    return admin_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "receiver"])
    parser.add_argument("--database-url", help="a server's admin URL (default: one of its own)")
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.role == "receiver":
        on_services_loop(receive(0))
        return
    quiet_logging()
    admin_url = args.database_url or own_server()
    database = f"bench_webhooks_{os.getpid()}"
    url = postgres.ensure_database(admin_url, database)
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
        postgres.drop_database(admin_url, database)


if __name__ == "__main__":
    main()
