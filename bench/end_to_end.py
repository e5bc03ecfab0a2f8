"""Jobs end to end: SubmitJob over gRPC until SUCCEEDED, with real outputs through media.

Starts the real stack with creation's API alone (``--role api``), plus 2 creation worker
processes (``--role worker``) on the same throwaway database, with the stub provider at
zero latency and zero duration (done on the first poll; it still transforms the input
with Pillow and returns real bytes, which the worker PUTs to media's signed URLs). 16
clients (one user each, limits lifted) submit ``--jobs`` jobs as fast as they are
answered; the clock stops when the last job is SUCCEEDED. Printed: jobs/s end to end,
the submit rate alone, CPU per job of each process and of PostgreSQL, and, as the anchor
measured in the same run, a bare grpc.aio echo server's calls/s at 16 clients.

    .venv/bin/python bench/end_to_end.py [--jobs 3000] [--workers 2] [--database-url URL]
        [--storage local|s3] [--size 64]

The jobs ask for ``--size`` square outputs, by default the 64 px input's own size. The
stub plays the provider inside the worker processes, so the workers' CPU includes the
rendering a vendor would do on its own machines (at 512 px that is 17-66 ms a job by
style, more than everything else together): the bench times the same render in its own
process beforehand and prints it beside a total without it.

CPU is read once media has made every thumbnail of the run (it makes them after a job
succeeded), so media's figure includes them. ``--storage s3`` keeps media's objects on
an S3-protocol server (moto, in this process, as the tests use) instead of the local
backend's directory.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import grpc
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier_client import AsyncClient, AtelierError, RetryPolicy
from bench.anchors import echo_call, echo_server
from bench.engine_drain import cpu_seconds
from bench.media_throughput import start_moto
from bench.scratch import scratch_folder
from bench.submit_throughput import store_input
from services.creation.providers.stub.styles import render
from services.dev import postgres
from services.dev.processes import Child, free_port, spawn
from services.dev.stack import Stack, StackPorts
from services.kit.auth import issue_token
from services.kit.listen import asyncpg_dsn
from services.kit.settings import DEV_JWT_SECRET

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
CLIENTS = 16
STYLE = "watercolor"
UNFINISHED = """
    SELECT EXISTS (SELECT 1 FROM creation.jobs WHERE status = 'queued')
        OR EXISTS (SELECT 1 FROM creation.jobs WHERE status = 'running')"""
# Outputs media has yet to make a thumbnail of (it makes them after the job succeeded).
WITHOUT_THUMBNAIL = """
    SELECT count(*) FROM media.assets WHERE status = 'ready' AND purpose = 'ai_output'
        AND thumbnail_content_type IS NULL AND thumbnail_failure IS NULL"""
LIMITS_LIFTED = {
    "ATELIER_DAILY_QUOTA": "100000",
    "ATELIER_IN_FLIGHT_LIMIT": "1000",
    "ATELIER_WELCOME_POINTS": "1000000",
    "ATELIER_LOG_LEVEL": "WARNING",
}


def start_worker(stack: Stack, index: int) -> Child:
    env = {
        **LIMITS_LIFTED,
        "ATELIER_ENV": "dev",
        "ATELIER_DATABASE_URL": stack.database_url,
        "ATELIER_CREATION_PUBLIC_PORT": str(free_port()),
        "ATELIER_CREATION_INTERNAL_PORT": str(free_port()),
        "ATELIER_CREATION_METRICS_PORT": str(free_port()),
        "ATELIER_MEDIA_INTERNAL_ADDRESS": f"127.0.0.1:{stack.ports.internal['media']}",
        "ATELIER_STUB_STATE_DIR": str(stack.work_dir / "stub"),
        "ATELIER_STUB_DURATION": "0",
        "ATELIER_STUB_LATENCY": "0",
        "ATELIER_WORKER_CONCURRENCY": "128",
        "ATELIER_WORKER_CLAIM_BATCH": "64",
        "ATELIER_WORKER_PROVIDER_POLL": "0.01",
        "ATELIER_DB_POOL_SIZE": "10",
        **stack.direct_objects_env(),
    }
    argv = [sys.executable, "-m", "services.creation", "--role", "worker"]
    return spawn(f"creation-worker-{index}", argv, env, stack.work_dir / "logs")


async def echo_anchor(address: str, calls: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        call = echo_call(channel)

        async def client() -> None:
            for _ in range(calls // CLIENTS):
                await call(b"x" * 64)

        await asyncio.gather(*(client() for _ in range(CLIENTS)))  # warm-up
        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return calls / (time.perf_counter() - began)


def media_calls(metrics_port: int) -> dict[str, float]:
    """media's internal RPCs answered so far, by method (its Prometheus counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    calls: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("atelier_rpc_total{") and "MediaInternalService" in line:
            labels, _, value = line.rpartition(" ")
            method = labels.split('method="', 1)[1].split('"', 1)[0]
            calls[method] = calls.get(method, 0.0) + float(value)
    return calls


def stub_render_ms(size: int) -> float:
    """CPU of the stub's own render of one bench job (the provider's work), median of 20."""
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(buffer, "PNG")
    data = buffer.getvalue()
    spent = []
    for _ in range(20):
        began = time.process_time()
        render(data, STYLE, 1, 50_000_000, (size, size))
        spent.append(time.process_time() - began)
    return statistics.median(spent) * 1000


async def bench(stack: Stack, workers: list[Child], jobs: int, size: int) -> None:
    users = [f"e2e-{uuid.uuid4().hex[:8]}-{i}" for i in range(CLIENTS)]
    tokens = [issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", u, 3600) for u in users]
    assets = [await store_input(stack.ports.internal["media"], u) for u in users]
    watcher = await asyncpg.connect(asyncpg_dsn(stack.database_url))
    retried = 0

    def count_retry(error: AtelierError, delay: float) -> None:
        nonlocal retried
        retried += 1

    # As a real client does: an UNAVAILABLE (a dependency's deadline on a machine this
    # busy) is tried again, with the same request_id, after the server's RetryInfo.
    atelier = AsyncClient.connect(
        f"127.0.0.1:{stack.ports.public['creation']}",
        token="",
        retry=RetryPolicy(max_attempts=50, deadline=120.0),
        on_retry=count_retry,
    )
    callers = [atelier.with_token(token) for token in tokens]

    async def submit(client: int) -> None:
        await callers[client].submit(
            model_id="stub-fast",
            style_id=STYLE,
            input_asset_id=assets[client],
            prompt="bench",
            width=size,
            height=size,
        )

    async def until_done() -> None:
        while await watcher.fetchval(UNFINISHED):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def client(index: int, count: int) -> None:
        for _ in range(count):
            await submit(index)

    try:
        # Warm-up: every worker connected and every path taken once.
        await asyncio.gather(*(client(i, 4) for i in range(CLIENTS)))
        await until_done()
        processes = {child.name: child.process.pid for child in [*stack.children, *workers]}
        backends = [
            r["pid"]
            for r in await watcher.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
        before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        calls_before = media_calls(stack.ports.metrics["media"])
        database_before = {pid: cpu_seconds(pid) for pid in backends}
        began = time.perf_counter()
        await asyncio.gather(*(client(i, jobs // CLIENTS) for i in range(CLIENTS)))
        submitted = time.perf_counter() - began
        await until_done()
        elapsed = time.perf_counter() - began
        # media's CPU counts the thumbnails of these jobs too: read once they are made.
        pending = await watcher.fetchval(WITHOUT_THUMBNAIL)
        while pending and time.perf_counter() - began < 600:
            await asyncio.sleep(0.05)
            pending = await watcher.fetchval(WITHOUT_THUMBNAIL)
        thumbnails_after = time.perf_counter() - began - elapsed
        calls_after = media_calls(stack.ports.metrics["media"])
        total = jobs // CLIENTS * CLIENTS
        succeeded = await watcher.fetchval(
            "SELECT count(*) FROM creation.jobs WHERE status = 'succeeded'"
        )
        unsuccessful = await watcher.fetch(
            "SELECT status, error_code, error_reason, count(*) FROM creation.jobs"
            " WHERE status <> 'succeeded' GROUP BY 1, 2, 3 ORDER BY 4 DESC"
        )
        backends = [
            r["pid"]
            for r in await watcher.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
        database = sum(cpu_seconds(pid) - database_before.get(pid, 0.0) for pid in backends)
    finally:
        await atelier.close()
        await watcher.close()
    print(f"{total} jobs, {CLIENTS} clients, {len(workers)} worker processes")
    print(f"end to end: {total / elapsed:.0f} jobs/s (submits alone {total / submitted:.0f}/s)")
    print(f"succeeded: {succeeded} of {total + CLIENTS * 4} (with the warm-up)")
    for row in unsuccessful:
        print(f"  not succeeded: {row[3]} {row[0]} {row[1] or ''} {row[2] or ''}".rstrip())
    print(f"submits answered UNAVAILABLE and tried again: {retried}")
    print(f"thumbnails all made {thumbnails_after:.1f} s after the last job succeeded")
    per_job = {
        method: (count - calls_before.get(method, 0.0)) / total
        for method, count in sorted(calls_after.items())
        if count > calls_before.get(method, 0.0)
    }
    print("media calls per job: " + ", ".join(f"{m} {n:.3f}" for m, n in per_job.items()))
    summed = database
    for name, pid in processes.items():
        spent = cpu_seconds(pid) - before[name]
        summed += spent
        print(f"  CPU {name:<18} {spent / total * 1000:6.3f} ms/job")
    print(f"  CPU {'postgresql':<18} {database / total * 1000:6.3f} ms/job")
    rendering = stub_render_ms(size)
    print(f"  CPU {'all processes':<18} {summed / total * 1000:6.3f} ms/job")
    print(f"    of which the stub provider's render (a vendor's work) {rendering:.3f} ms/job")
    print(f"  CPU {'atelier alone':<18} {summed / total * 1000 - rendering:6.3f} ms/job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--database-url", help="an admin URL; default: local or embedded")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="a PostgreSQL of the bench's own (a shared server may run out of connections)",
    )
    parser.add_argument(
        "--storage",
        choices=("local", "s3"),
        default="local",
        help="media's object storage: its local directory, or S3 (a moto server)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=64,
        help="the outputs' width and height (default: the 64 px input's own size)",
    )
    args = parser.parse_args()
    work = scratch_folder("atelier-e2e-")
    moto: object | None = None
    storage_env: dict[str, str] = {}
    if args.storage == "s3":
        moto, storage_env = start_moto()
    if args.embedded:
        admin = postgres.start_embedded(work / "pg")
    else:
        admin = args.database_url or (
            LOCAL_POSTGRES
            if postgres.server_answers(LOCAL_POSTGRES)
            else postgres.start_embedded(work / "pg")
        )
    name = f"atelier_e2e_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(admin, name)
    stack = Stack(
        database_url=url,
        ports=StackPorts.free(),
        work_dir=work,
        log_dir=work / "logs",
        creation_role="api",
        extra_env={**LIMITS_LIFTED, **storage_env},
    )
    stack.migrate()
    stack.start()
    workers: list[Child] = []
    try:
        workers = [start_worker(stack, i) for i in range(args.workers)]
        with echo_server() as echo_address:
            echo = asyncio.run(echo_anchor(echo_address, 3200))
        asyncio.run(bench(stack, workers, args.jobs, args.size))
        print(f"storage: {args.storage}")
        print(f"anchor: bare grpc.aio echo at {CLIENTS} clients {echo:.0f} calls/s")
    finally:
        for worker in workers:
            worker.stop()
        stack.stop()
        postgres.drop_database(admin, name)
        if moto is not None:
            moto.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
