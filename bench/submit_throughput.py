"""SubmitJob throughput and latency, over gRPC and as JSON through Envoy.

Starts the real stack (three services and Envoy) on free ports against a throwaway
database, stores one input photo per simulated user through media, then submits jobs with
1 and 16 concurrent clients (each client its own user, as on a phone) and prints jobs/s
and p50/p99 latency. At one client, gRPC straight to creation, native gRPC through Envoy
and JSON through Envoy run in alternating blocks (a change in the machine's load falls on
all of them). JSON goes over plain keep-alive HTTP/1.1 connections (bench/anchors.py's
Http1Client) and, at one client, over aiohttp too. In the same run it
measures the anchors and the read RPCs at one client, and prints the ratios and the CPU
spent per operation by creation, media, notify, PostgreSQL, this client and Envoy. The
anchors: a bare grpc.aio echo server in its own process, called in blocks alternating
with the paths it is compared with (the one-client submits, the 16-client submits, the
reads), so that a ratio never compares figures taken a minute apart on a machine whose
speed drifts; a bare HTTP/1.1 echo server through that JSON client and through aiohttp;
plain asyncpg running the very call the store sends for a submit, from this process, on
a pool of its own. Before the 16-client submits, a warm-up of its own users opens
creation's pool connections (the one-client phase used a few), printed as "cold pool":
a fresh connection's first calls are a start-up cost, not the steady tail the 16-client
p99 measures (docs/benchmarks.md, "the submit tail"). A submit phase's CPU is read once creation's
outbox relay has delivered every row the phase wrote (so the relay's and notify's share of
each submit is in the figure).

    .venv/bin/python bench/submit_throughput.py [--requests 1000] [--database-url URL]
    .venv/bin/python bench/submit_throughput.py --submit-only   # anchors and gRPC submits
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg  # type: ignore[import-untyped]
import grpc
from PIL import Image
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
)
from atelier_client import AsyncClient
from bench.anchors import Http1Client, echo_call, echo_server, http_echo_server
from bench.cpu import CpuMeter, format_per_op
from bench.scratch import scratch_folder
from services.creation.store.submit_statement import SUBMIT_CALL, submit_arguments
from services.dev import postgres
from services.dev.stack import Stack, StackPorts
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


async def store_input(port: int, owner: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(buffer, "PNG")

    async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner,
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                content_type="image/png",
            )
        )
        yield media_internal_service_pb2.PutAssetRequest(chunk=buffer.getvalue())

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.PutAsset(
            parts(), metadata=(("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)
        )
    return str(reply.asset.asset_id)


async def run_clients(
    clients: int, per_client: int, submit: Callable[[int, int], Awaitable[None]]
) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def client(index: int) -> None:
        for n in range(per_client):
            started = time.perf_counter()
            await submit(index, n)
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return time.perf_counter() - began, latencies


Submit = Callable[[int, int], Awaitable[None]]


@dataclass(frozen=True)
class Figure:
    per_second: float
    p50_ms: float
    p99_ms: float


def report(label: str, clients: int, elapsed: float, latencies: list[float]) -> Figure:
    cut = statistics.quantiles(latencies, n=100)
    figure = Figure(len(latencies) / elapsed, cut[49] * 1000, cut[98] * 1000)
    print(
        f"{label:<28} {clients:>7} {len(latencies):>8} {figure.per_second:>9.0f}"
        f" {figure.p50_ms:>8.2f} {figure.p99_ms:>8.2f}"
    )
    return figure


async def new_users(stack: Stack) -> tuple[list[str], list[str]]:
    """Sixteen fresh users (tokens, input assets): each run starts below every limit."""
    users = [f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(16)]
    tokens = [issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", u, 3600) for u in users]
    assets = [await store_input(stack.ports.internal["media"], u) for u in users]
    return tokens, assets


ECHO = "echo (anchor)"


def echo_once(channel: grpc.aio.Channel) -> Submit:
    """One bare grpc.aio echo call (the anchor), shaped as a bench path."""
    call = echo_call(channel)
    payload = b"x" * 64

    async def once(_: int, __: int) -> None:
        await call(payload)

    return once


def postgres_backends(database: str) -> list[int]:
    """The PostgreSQL backends serving ``database`` (by their process titles)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("postgres: ") and f" {database} " in title:
            pids.append(int(entry))
    return pids


async def outbox_drained(database_url: str, within: float = 60.0) -> None:
    """Returns once creation's relay has marked every outbox row delivered."""
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + within
        query = "SELECT count(*) FROM creation.outbox WHERE delivered_at IS NULL"
        while await connection.fetchval(query):
            if time.monotonic() > deadline:
                raise TimeoutError("the outbox relay left rows undelivered")
            await asyncio.sleep(0.01)
    finally:
        await connection.close()


def cpu_meter(stack: Stack, database: str) -> CpuMeter:
    pids = {child.name: child.process.pid for child in stack.children}
    return CpuMeter(
        {
            "creation": lambda: [pids["creation"]],
            "media": lambda: [pids["media"]],
            # The outbox relay in creation hands every submit's row to notify's Deliver.
            "notify": lambda: [pids["notify"]],
            "postgres": lambda: postgres_backends(database),
            "client": lambda: [os.getpid()],
            "envoy": lambda: [pids["envoy"]],
        }
    )


def submit_call_arguments(user: str) -> list[object]:
    """The store's submit call for a new job of ``user``, limits lifted (as for the
    service below: every job stays queued)."""
    job_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    return submit_arguments(
        job_id=job_id,
        user_id=user,
        idempotency_key=None,
        model_id="stub-fast",
        style_id="natural",
        input_asset_id=str(uuid.uuid4()),
        prompt="bench",
        negative_prompt="",
        width=512,
        height=512,
        parameters="{}",
        max_attempts=3,
        request_hash="0" * 64,
        day_start=now.replace(hour=0, minute=0, second=0, microsecond=0),
        daily_quota=10**9,
        in_flight_limit=10**9,
        welcome_points=10**9,
        now=now,
        num_outputs=1,
        trace_parent=None,
        via=None,
    )


async def submit_sql_anchor(database_url: str, requests: int) -> dict[int, Figure]:
    """Plain asyncpg sending the store's own submit call (one round trip per job) from
    this process, a pool of 16, each client its own user: the floor under SubmitJob's
    database work."""
    figures = {}
    pool = await asyncpg.create_pool(database_url, min_size=16, max_size=16)
    users: list[str] = []
    try:
        for clients in (1, 16):
            users[:] = [f"anchor-{uuid.uuid4().hex[:8]}-{i}" for i in range(clients)]

            async def submit(client: int, _: int) -> None:
                arguments = submit_call_arguments(users[client])
                row = await pool.fetchrow(SUBMIT_CALL, *arguments)
                assert row["submit_outcome"] == "ok", row["submit_outcome"]

            await run_clients(clients, 50 // clients or 1, submit)  # warm-up
            elapsed, latencies = await run_clients(clients, requests // clients, submit)
            figures[clients] = report("submit SQL (asyncpg)", clients, elapsed, latencies)
            await outbox_drained(database_url)
    finally:
        await pool.close()
    return figures


async def http_echo_anchor(host: str, port: int, requests: int) -> dict[str, Figure]:
    """The HTTP echo at one client through the JSON client the bench uses
    (:class:`Http1Client`) and, for comparison, through aiohttp."""
    figures = {}
    plain = Http1Client(host, port)
    body = job_json(str(uuid.uuid4()))
    headers = {"content-type": "application/json"}
    try:
        async with aiohttp.ClientSession(f"http://{host}:{port}") as session:

            async def over_aiohttp(_: int, __: int) -> None:
                async with session.post("/", data=body, headers=headers) as response:
                    response.raise_for_status()
                    await response.read()

            async def over_plain(_: int, __: int) -> None:
                await plain.request("POST", "/", body, headers)

            for label, once in (
                ("HTTP echo (anchor)", over_plain),
                ("HTTP echo via aiohttp", over_aiohttp),
            ):
                await run_clients(1, 50, once)  # warm-up
                elapsed, latencies = await run_clients(1, requests, once)
                figures[label] = report(label, 1, elapsed, latencies)
    finally:
        await plain.close()
    return figures


AIOHTTP_PATH = "SubmitJob via Envoy aiohttp"
# Calls per client of the sixteen-client warm-up (a cold pool's connections opened).
COLD_PER_CLIENT = 4
# The paths of a phase, the echo anchor among them, run in this many alternating blocks,
# so a change in the machine's speed during the run falls on every path and its anchor
# alike (the ratios compare figures taken side by side, not a minute apart).
BLOCKS = 5


async def interleaved(
    paths: dict[str, Submit],
    clients: int,
    requests: int,
    meter: CpuMeter,
    cpu: dict[str, dict[str, float]],
    *,
    settle: Callable[[], Awaitable[None]] | None = None,
    cpu_label: Callable[[str], str] = lambda name: name,
) -> dict[str, Figure]:
    """Each path at ``clients`` clients, about ``requests`` calls in all, in BLOCKS blocks
    taken in turn (the order rotating by block). After each block of a path other than
    the echo anchor, ``settle`` runs (e.g. until the outbox relay has delivered the
    block's rows), and the stack's CPU per call is summed over the path's blocks."""
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    elapsed = dict.fromkeys(paths, 0.0)
    spent: dict[str, dict[str, float]] = {name: {} for name in paths}
    names = list(paths)
    for block in range(BLOCKS):
        size = requests // BLOCKS + (1 if block < requests % BLOCKS else 0)
        if not size:
            continue
        per_client = max(1, size // clients)
        for name in names[block % len(names) :] + names[: block % len(names)]:
            meter.start()
            took, block_latencies = await run_clients(clients, per_client, paths[name])
            if name != ECHO:
                if settle is not None:
                    await settle()
                done = len(block_latencies)
                for group, ms in meter.per_op(done).items():
                    spent[name][group] = spent[name].get(group, 0.0) + ms * done
            latencies[name] += block_latencies
            elapsed[name] += took
    figures = {}
    for name in names:
        done = len(latencies[name])
        if name != ECHO:
            cpu[cpu_label(name)] = {group: ms / done for group, ms in spent[name].items()}
        figures[name] = report(name, clients, elapsed[name], latencies[name])
    return figures


def job_json(asset_id: str) -> bytes:
    """SubmitJob's request as the JSON API takes it."""
    return json.dumps(
        {
            "modelId": "stub-fast",
            "styleId": "natural",
            "inputAssetId": asset_id,
            "prompt": "bench",
            "width": 512,
            "height": 512,
        }
    ).encode()


async def bench(
    stack: Stack,
    echo_address: str,
    http_echo: tuple[str, int],
    requests: int,
    submit_only: bool,
) -> None:
    tokens: list[str] = []
    assets: list[str] = []
    submits: dict[tuple[str, int], Figure] = {}
    print(f"{'path':<28} {'clients':>7} {'calls':>8} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    client_anchor = {} if submit_only else await http_echo_anchor(*http_echo, requests)
    sql = await submit_sql_anchor(stack.database_url, requests)
    meter = cpu_meter(stack, make_url(stack.database_url).database or "")
    cpu: dict[str, dict[str, float]] = {}

    # JSON goes through the edge on plain keep-alive HTTP/1.1 connections, one per client
    # (bench/anchors.py says why not aiohttp; the HTTP echo anchor shows both).
    plain = [Http1Client("127.0.0.1", stack.ports.envoy) for _ in range(16)]
    async with (
        grpc.aio.insecure_channel(echo_address) as echo_channel,
        AsyncClient.connect(f"127.0.0.1:{stack.ports.public['creation']}", token="") as direct,
        AsyncClient.connect(f"127.0.0.1:{stack.ports.envoy}", token="") as through_edge,
        aiohttp.ClientSession(f"http://127.0.0.1:{stack.ports.envoy}") as session,
    ):
        # One client, one channel; each simulated phone calls as its own user (of the
        # users of the phase: call after new_users).
        def over_grpc(client: AsyncClient, user: int | None = None) -> Submit:
            callers = [client.with_token(token) for token in tokens]

            async def submit(index: int, _: int) -> None:
                mine = index if user is None else user
                await callers[mine].submit(
                    model_id="stub-fast",
                    style_id="natural",
                    input_asset_id=assets[mine],
                    prompt="bench",
                    width=512,
                    height=512,
                )

            return submit

        def over_envoy(user: int | None = None) -> Submit:
            async def submit(index: int, _: int) -> None:
                mine = index if user is None else user
                await plain[index].request(
                    "POST",
                    "/v1/jobs",
                    job_json(assets[mine]),
                    {"content-type": "application/json", "authorization": f"Bearer {tokens[mine]}"},
                )

            return submit

        def over_aiohttp(user: int) -> Submit:
            async def submit(_: int, __: int) -> None:
                async with session.post(
                    "/v1/jobs",
                    data=job_json(assets[user]),
                    headers={
                        "content-type": "application/json",
                        "authorization": f"Bearer {tokens[user]}",
                    },
                ) as response:
                    response.raise_for_status()
                    await response.read()

            return submit

        echo_call_once = echo_once(echo_channel)
        for clients in (1, 16):
            await run_clients(clients, 50 // clients, echo_call_once)  # warm-up

        async def relayed() -> None:
            await outbox_drained(stack.database_url)

        def per_path(clients: int) -> Callable[[str], str]:
            return lambda name: f"{name} x{clients}"

        try:
            # One client: the echo anchor, gRPC straight to creation, and (unless
            # --submit-only) native gRPC and JSON through the edge (JSON over aiohttp too,
            # for comparison), each submit path its own user, in alternating blocks.
            tokens[:], assets[:] = await new_users(stack)
            one = {ECHO: echo_call_once, "SubmitJob gRPC": over_grpc(direct, 0)}
            if not submit_only:
                one["SubmitJob gRPC via Envoy"] = over_grpc(through_edge, 1)
                one["SubmitJob via Envoy"] = over_envoy(2)
                one[AIOHTTP_PATH] = over_aiohttp(3)
            # No warm-up: each user's jobs all stay queued, up to the in-flight limit.
            figures = await interleaved(
                one, 1, requests, meter, cpu, settle=relayed, cpu_label=per_path(1)
            )
            echo = {1: figures.pop(ECHO)}
            for name, figure in figures.items():
                submits[name, 1] = figure

            # Sixteen clients. First a warm-up with users of its own: the one-client phase
            # left creation's pool with a few connections, and a fresh connection's first
            # submit costs about 14 ms more (connect, asyncpg's look at the result's types,
            # the function's first compile in that backend); sixteen of them at once, on
            # two cores, are 250-330 ms calls: 1.6 % of the phase, its whole p99
            # (docs/benchmarks.md, "the submit tail"). Printed on its own line.
            tokens[:], assets[:] = await new_users(stack)
            elapsed, latencies = await run_clients(16, COLD_PER_CLIENT, over_grpc(direct))
            report("SubmitJob gRPC cold pool", 16, elapsed, latencies)
            await outbox_drained(stack.database_url)
            # Then SubmitJob and the echo anchor in turn, each client its own (new) user.
            tokens[:], assets[:] = await new_users(stack)
            sixteen = {ECHO: echo_call_once, "SubmitJob gRPC": over_grpc(direct)}
            figures = await interleaved(
                sixteen, 16, requests, meter, cpu, settle=relayed, cpu_label=per_path(16)
            )
            echo[16] = figures[ECHO]
            submits["SubmitJob gRPC", 16] = figures["SubmitJob gRPC"]

            if not submit_only:
                tokens[:], assets[:] = await new_users(stack)
                elapsed, latencies = await run_clients(16, requests // 16, over_envoy())
                submits["SubmitJob via Envoy", 16] = report(
                    "SubmitJob via Envoy", 16, elapsed, latencies
                )
                await outbox_drained(stack.database_url)
        finally:
            for connection in plain:
                await connection.close()

    if submit_only:
        print()
        for clients in (1, 16):
            print(
                f"ratios: SubmitJob gRPC / echo at {clients} client(s) "
                f"{submits['SubmitJob gRPC', clients].per_second / echo[clients].per_second:.3f}"
                " (throughput)"
            )
        print()
        for phase, spent in cpu.items():
            print(f"{phase:<30} {format_per_op(spent)}")
        return

    async with grpc.aio.insecure_channel(echo_address) as echo_channel:
        reads = await read_latencies(
            stack, tokens[0], assets[0], requests, meter, cpu, echo_once(echo_channel)
        )
    echo_beside_reads = reads.pop(ECHO)
    grpc_one = submits["SubmitJob gRPC", 1].p50_ms
    print()
    print(
        "ratios: SubmitJob gRPC / echo at 16 clients "
        f"{submits['SubmitJob gRPC', 16].per_second / echo[16].per_second:.3f} (throughput)"
    )
    print(
        "ratios: Envoy / gRPC p50 at 1 client: JSON "
        f"{submits['SubmitJob via Envoy', 1].p50_ms / grpc_one:.2f} (over aiohttp "
        f"{submits[AIOHTTP_PATH, 1].p50_ms / grpc_one:.2f}), native gRPC "
        f"{submits['SubmitJob gRPC via Envoy', 1].p50_ms / grpc_one:.2f} (client anchors p50: "
        f"HTTP echo {client_anchor['HTTP echo (anchor)'].p50_ms:.2f} ms, "
        f"gRPC echo {echo[1].p50_ms:.2f} ms)"
    )
    for clients in (1, 16):
        grpc_figure = submits["SubmitJob gRPC", clients]
        print(
            f"ratios: SubmitJob gRPC / submit SQL (asyncpg) at {clients} client(s) "
            f"{grpc_figure.per_second / sql[clients].per_second:.3f}"
            f" (throughput), p50 {grpc_figure.p50_ms / sql[clients].p50_ms:.2f}x"
        )
    for name, figure in reads.items():
        ratio = figure.p50_ms / echo_beside_reads.p50_ms
        print(f"ratios: {name} p50 / echo p50 at 1 client {ratio:.2f}")
    print()
    for phase, spent in cpu.items():
        print(f"{phase:<30} {format_per_op(spent)}")


async def read_latencies(
    stack: Stack,
    token: str,
    asset_id: str,
    requests: int,
    meter: CpuMeter,
    cpu: dict[str, dict[str, float]],
    echo: Submit,
) -> dict[str, Figure]:
    """The read RPCs at one client, each on a job and an asset that exist, in blocks
    alternating with the echo anchor's (whose figure comes back as ECHO)."""
    service = (("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)
    atelier = AsyncClient.connect(f"127.0.0.1:{stack.ports.public['creation']}", token=token)
    media = grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['media']}")
    async with atelier, media:
        media_stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(media)
        job_id = (await atelier.list_jobs(page_size=1)).jobs[0].job_id
        calls: dict[str, Callable[[int, int], Awaitable[object]]] = {
            "GetJob": lambda _, __: atelier.get_job(job_id),
            "GetBalance": lambda _, __: atelier.get_balance(),
            "ListCatalog": lambda _, __: atelier.list_catalog(),
            "GetAssetInfo": lambda _, __: media_stub.GetAssetInfo(
                media_internal_service_pb2.GetAssetInfoRequest(asset_id=asset_id),
                metadata=service,
            ),
        }
        paths: dict[str, Submit] = {ECHO: echo}
        for name, call in calls.items():

            async def once(
                client: int, n: int, call: Callable[..., Awaitable[object]] = call
            ) -> None:
                await call(client, n)

            await run_clients(1, 20, once)  # warm-up
            paths[name] = once
        return await interleaved(paths, 1, requests, meter, cpu)


# The most jobs one user may have queued (ATELIER_IN_FLIGHT_LIMIT's upper bound).
MAX_REQUESTS = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=MAX_REQUESTS, help="per path and concurrency"
    )
    parser.add_argument("--database-url", help="an admin URL; default: local or embedded")
    parser.add_argument(
        "--submit-only",
        action="store_true",
        help="the anchors and SubmitJob over gRPC only (no Envoy, no reads)",
    )
    args = parser.parse_args()
    if not 1 <= args.requests <= MAX_REQUESTS:
        # At one client every job is one user's, and they all stay queued.
        parser.error(f"--requests must be 1 to {MAX_REQUESTS} (ATELIER_IN_FLIGHT_LIMIT's bound)")
    unlimited = "1000000"
    # The API alone: no job engine takes CPU from it, every job stays queued, so the
    # per-user limits are lifted.
    limits_lifted = {
        "ATELIER_DAILY_QUOTA": "100000",
        "ATELIER_IN_FLIGHT_LIMIT": str(MAX_REQUESTS),
        "ATELIER_WELCOME_POINTS": unlimited,
    }
    with (
        api_stack(args.database_url, limits_lifted) as stack,
        echo_server() as echo_address,
        http_echo_server() as http_echo,
    ):
        asyncio.run(bench(stack, echo_address, http_echo, args.requests, args.submit_only))


@contextmanager
def api_stack(database_url: str | None, extra_env: dict[str, str]) -> Iterator[Stack]:
    """The stack with creation in role ``api`` (its relay runs, no job engine), on a
    throwaway database of ``database_url`` (an admin URL; default: the local server, else
    an embedded one), logging warnings only; stopped and dropped afterwards."""
    work = scratch_folder("atelier-bench-")
    admin = database_url or (
        LOCAL_POSTGRES
        if postgres.server_answers(LOCAL_POSTGRES)
        else postgres.start_embedded(work / "pg")
    )
    name = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(admin, name)
    stack = Stack(
        database_url=url,
        ports=StackPorts.free(),
        work_dir=work,
        log_dir=work / "logs",
        creation_role="api",
        extra_env={**extra_env, "ATELIER_LOG_LEVEL": "WARNING"},
    )
    stack.migrate()
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        postgres.drop_database(admin, name)


if __name__ == "__main__":
    main()
