"""SubmitJob throughput and latency, over gRPC and as JSON through Envoy.

Starts the real stack (three services and Envoy) on free ports against a throwaway
database, stores one input photo per simulated user through media, then submits jobs with
1 and 16 concurrent clients (each client its own user, as on a phone) and prints jobs/s
and p50/p99 latency.

    .venv/bin/python bench/submit_throughput.py [--requests 2000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
)
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


def report(label: str, clients: int, elapsed: float, latencies: list[float]) -> None:
    cut = statistics.quantiles(latencies, n=100)
    print(
        f"{label:<16} {clients:>7} {len(latencies):>8} {len(latencies) / elapsed:>9.0f}"
        f" {cut[49] * 1000:>8.2f} {cut[98] * 1000:>8.2f}"
    )


async def new_users(stack: Stack) -> tuple[list[str], list[str]]:
    """Sixteen fresh users (tokens, input assets): each run starts below every limit."""
    users = [f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(16)]
    tokens = [issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", u, 3600) for u in users]
    assets = [await store_input(stack.ports.internal["media"], u) for u in users]
    return tokens, assets


async def bench(stack: Stack, requests: int) -> None:
    tokens: list[str] = []
    assets: list[str] = []
    print(f"{'path':<16} {'clients':>7} {'jobs':>8} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8}")

    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.public['creation']}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)

        async def over_grpc(client: int, _: int) -> None:
            await stub.SubmitJob(
                creation_service_pb2.SubmitJobRequest(
                    model_id="stub-fast",
                    style_id="natural",
                    input_asset_id=assets[client],
                    prompt="bench",
                    width=512,
                    height=512,
                ),
                metadata=(("authorization", f"Bearer {tokens[client]}"),),
            )

        for clients in (1, 16):
            tokens[:], assets[:] = await new_users(stack)
            elapsed, latencies = await run_clients(clients, requests // clients, over_grpc)
            report("gRPC", clients, elapsed, latencies)

    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.ports.envoy}", limits=limits
    ) as http:

        async def over_envoy(client: int, _: int) -> None:
            response = await http.post(
                "/v1/jobs",
                headers={"authorization": f"Bearer {tokens[client]}"},
                json={
                    "modelId": "stub-fast",
                    "styleId": "natural",
                    "inputAssetId": assets[client],
                    "prompt": "bench",
                    "width": 512,
                    "height": 512,
                },
            )
            response.raise_for_status()

        for clients in (1, 16):
            tokens[:], assets[:] = await new_users(stack)
            elapsed, latencies = await run_clients(clients, requests // clients, over_envoy)
            report("JSON via Envoy", clients, elapsed, latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per path and concurrency")
    parser.add_argument("--database-url", help="an admin URL; default: local or embedded")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="atelier-bench-"))
    admin = args.database_url or (
        LOCAL_POSTGRES
        if postgres.server_answers(LOCAL_POSTGRES)
        else postgres.start_embedded(work / "pg")
    )
    name = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(admin, name)
    unlimited = "1000000"
    stack = Stack(
        database_url=url,
        ports=StackPorts.free(),
        work_dir=work,
        log_dir=work / "logs",
        # No worker runs: every job stays queued, so lift the per-user limits.
        extra_env={
            "ATELIER_DAILY_QUOTA": "100000",
            "ATELIER_IN_FLIGHT_LIMIT": "1000",
            "ATELIER_WELCOME_POINTS": unlimited,
            "ATELIER_LOG_LEVEL": "WARNING",
        },
    )
    stack.migrate()
    stack.start()
    try:
        asyncio.run(bench(stack, args.requests))
    finally:
        stack.stop()
        postgres.drop_database(admin, name)


if __name__ == "__main__":
    main()
