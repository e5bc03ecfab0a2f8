"""Media throughput and memory for a large image.

Starts PostgreSQL (the local one, or an embedded one), a throwaway database, and the media
service as its own process (local storage, or S3 on an in-process moto server with
``--storage s3``). Then, for a ~10 MB JPEG, it measures:

- upload-complete: CreateUpload → HTTP PUT to the signed URL → CompleteUpload (media
  re-reads the object, hashes it and decodes it with Pillow);
- PutAsset: one client stream of chunks to the internal service (media spools, hashes,
  decodes and stores);
- ReadAsset: the stream back, for reference;

and the media process's peak resident memory during each phase (Linux VmHWM, reset at
the start of each phase through /proc/<pid>/clear_refs) over its resident size just
before the phase: what handling the image costs, beside the process's own baseline.

    .venv/bin/python bench/media_throughput.py [--storage local|s3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2 as internal_pb
from bench.scratch import scratch_folder
from services.dev import postgres
from services.dev.processes import free_port, grpc_serving, spawn, wait_until
from services.kit import migrations
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
MIB = 1024 * 1024


def big_jpeg(target_bytes: int) -> bytes:
    """A photo-sized JPEG of about ``target_bytes``: random pixels barely compress."""
    side = 1024
    rng = random.Random(1)  # noqa: S311 - pixels, not secrets
    for _ in range(6):
        image = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=95)
        size = buffer.tell()
        if abs(size - target_bytes) < target_bytes * 0.03:
            break
        side = int(side * (target_bytes / size) ** 0.5)
    return buffer.getvalue()


def memory_kib(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


def reset_peak(pid: int) -> None:
    """Resets VmHWM to the current RSS (Linux 4.0+, needs the right to write there)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def phase(
    name: str, pid: int, rounds: int, size: int, once: Callable[[], Awaitable[None]]
) -> dict[str, float]:
    """Times ``rounds`` calls after one warm-up call. Memory: the peak resident size over
    the resident size before the phase, for the warm-up call alone (first use: client
    set-up, thread pool, allocator pools) and for the measured calls after it."""
    cold_before = memory_kib(pid)["VmRSS"]
    reset_peak(pid)
    await once()
    cold_peak = memory_kib(pid)["VmHWM"]
    before = memory_kib(pid)["VmRSS"]
    reset_peak(pid)
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        await once()
        seconds.append(time.perf_counter() - started)
    peak = memory_kib(pid)["VmHWM"]
    result = {
        "median_s": statistics.median(seconds),
        "mb_per_s": size / MIB / statistics.median(seconds),
        "best_mb_per_s": size / MIB / min(seconds),
        "rss_before_mib": before / 1024,
        "peak_growth_mib": (peak - before) / 1024,
        "first_call_growth_mib": (cold_peak - cold_before) / 1024,
    }
    print(
        f"{name:16} {result['mb_per_s']:6.1f} MB/s (best {result['best_mb_per_s']:5.1f}, "
        f"median {result['median_s'] * 1000:4.0f} ms)  peak RSS +{result['peak_growth_mib']:4.1f}"
        f" MiB over {result['rss_before_mib']:.0f} MiB (first call +"
        f"{result['first_call_growth_mib']:.1f} MiB)",
        flush=True,
    )
    return result


async def measure(
    public: str, internal: str, pid: int, data: bytes, rounds: int, chunk: int
) -> None:
    user = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "bench-user", 3600)
    user_auth = (("authorization", f"Bearer {user}"),)
    service_auth = (("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)
    options = [("grpc.max_receive_message_length", 16 * MIB)]
    async with (
        grpc.aio.insecure_channel(public, options=options) as public_channel,
        grpc.aio.insecure_channel(internal, options=options) as internal_channel,
        httpx.AsyncClient(timeout=120) as http,
    ):
        media = media_service_pb2_grpc.MediaServiceStub(public_channel)
        worker = media_internal_service_pb2_grpc.MediaInternalServiceStub(internal_channel)
        stored: list[str] = []

        async def upload_complete() -> None:
            upload = await media.CreateUpload(
                media_service_pb2.CreateUploadRequest(
                    purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                    content_type="image/jpeg",
                    size_bytes=len(data),
                ),
                metadata=user_auth,
            )
            put = await http.put(
                upload.upload_url, content=data, headers=dict(upload.upload_headers)
            )
            put.raise_for_status()
            done = await media.CompleteUpload(
                media_service_pb2.CompleteUploadRequest(asset_id=upload.asset.asset_id),
                metadata=user_auth,
            )
            assert done.asset.status == asset_pb2.ASSET_STATUS_READY

        async def requests() -> AsyncIterator[internal_pb.PutAssetRequest]:
            yield internal_pb.PutAssetRequest(
                header=internal_pb.PutAssetHeader(
                    owner_user_id="bench-user",
                    purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                    content_type="image/jpeg",
                )
            )
            view = memoryview(data)
            for start in range(0, len(data), chunk):
                yield internal_pb.PutAssetRequest(chunk=bytes(view[start : start + chunk]))

        async def put_asset() -> None:
            reply = await worker.PutAsset(requests(), metadata=service_auth)
            assert reply.asset.status == asset_pb2.ASSET_STATUS_READY
            stored.append(reply.asset.asset_id)

        async def read_asset() -> None:
            received = 0
            call = worker.ReadAsset(
                internal_pb.ReadAssetRequest(asset_id=stored[0]), metadata=service_auth
            )
            async for message in call:
                received += len(message.chunk)
            assert received == len(data)

        await phase("upload-complete", pid, rounds, len(data), upload_complete)
        await phase("PutAsset", pid, rounds, len(data), put_asset)
        await phase("ReadAsset", pid, rounds, len(data), read_asset)


def start_moto() -> tuple[object, dict[str, str]]:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench-secret",  # noqa: S106 - moto accepts any key
    ).create_bucket(Bucket="bench")
    return server, {
        "ATELIER_MEDIA_STORAGE": "s3",
        "ATELIER_MEDIA_S3_ENDPOINT": endpoint,
        "ATELIER_MEDIA_S3_BUCKET": "bench",
        "ATELIER_MEDIA_S3_ACCESS_KEY_ID": "bench",
        "ATELIER_MEDIA_S3_SECRET_ACCESS_KEY": "bench-secret",
        "ATELIER_MEDIA_S3_PATH_STYLE": "true",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", choices=("local", "s3"), default="local")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size-mb", type=float, default=10.0)
    parser.add_argument("--chunk-bytes", type=int, default=256 * 1024)
    args = parser.parse_args()

    work = scratch_folder("atelier-bench-")
    admin_url = os.environ.get("ATELIER_TEST_POSTGRES_URL") or LOCAL_POSTGRES
    if not postgres.server_answers(admin_url):
        admin_url = postgres.start_embedded(work / "pg")
    database = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    database_url = postgres.ensure_database(admin_url, database)
    migrations.upgrade("media", database_url)

    moto = None
    env = {
        "ATELIER_ENV": "dev",  # `atelier serve` assumes prod, which wants real secrets
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_LOG_LEVEL": "WARNING",
        "ATELIER_MAX_UPLOAD_BYTES": str(64 * MIB),
        "ATELIER_MEDIA_CHUNK_BYTES": str(args.chunk_bytes),
        "ATELIER_MEDIA_LOCAL_DIR": str(work / "objects"),
    }
    if args.storage == "s3":
        moto, s3_env = start_moto()
        env.update(s3_env)
    ports = {name: free_port() for name in ("PUBLIC", "INTERNAL", "METRICS", "HTTP")}
    for name, number in ports.items():
        env[f"ATELIER_MEDIA_{name}_PORT"] = str(number)
    env["ATELIER_MEDIA_PUBLIC_BASE_URL"] = f"http://127.0.0.1:{ports['HTTP']}"

    data = big_jpeg(int(args.size_mb * 1000 * 1000))
    print(
        f"media throughput: {len(data) / MIB:.2f} MiB JPEG, storage {args.storage}, "
        f"chunk {args.chunk_bytes // 1024} KiB, {args.rounds} rounds; "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        flush=True,
    )
    media = spawn("media", [sys.executable, "-m", "services.media"], env, work / "logs")
    try:
        wait_until(media, grpc_serving(f"127.0.0.1:{ports['PUBLIC']}"), 60)
        asyncio.run(
            measure(
                f"127.0.0.1:{ports['PUBLIC']}",
                f"127.0.0.1:{ports['INTERNAL']}",
                media.process.pid,
                data,
                args.rounds,
                args.chunk_bytes,
            )
        )
    finally:
        media.stop()
        if moto is not None:
            moto.stop()  # type: ignore[attr-defined]
        postgres.drop_database(admin_url, database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
