"""media's memory against an output's size, on the worker's path: does a 20 MiB output
cost media more resident memory than a 100 KiB one?

Starts media as its own process (local storage, or S3 on an in-process moto server with
``--storage s3``) on a throwaway database, and lands outputs the way the in-process
worker does (creation's MediaClient reserves and commits over gRPC, ObjectTransfer PUTs
the bytes to the signed URL: media's object listener, or S3 itself). For each size it
lands one output as a warm-up, resets media's peak resident size (/proc/<pid>/clear_refs),
lands ``--rounds`` more, and prints the peak over the resident size before them. With
``--thumbnails on`` media's thumbnail maker runs as in service, woken by each commit (it
decodes each image, so its memory follows the pixel count, bounded by its two slots);
``off`` (the default) measures the landing path alone. Outputs are noisy PNGs (they
barely compress: the size is the pixel count's).

    .venv/bin/python bench/output_memory.py [--storage local|s3] [--rounds 5]
        [--thumbnails off|on]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import random
import sys
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.media_throughput import LOCAL_POSTGRES, memory_kib, reset_peak, start_moto
from bench.scratch import scratch_folder
from services.creation.media_client import MediaClient
from services.creation.object_transfer import ObjectTransfer
from services.dev import postgres
from services.dev.processes import free_port, grpc_serving, spawn, wait_until
from services.kit import migrations
from services.kit.listen import asyncpg_dsn
from services.kit.settings import DEV_SERVICE_TOKEN

KIB = 1024
MIB = 1024 * KIB
SIZES = (("100 KiB", 100 * KIB), ("20 MiB", 20 * MIB - 64 * KIB))
WITHOUT_THUMBNAIL = """
    SELECT count(*) FROM media.assets WHERE status = 'ready' AND purpose = 'ai_output'
        AND thumbnail_content_type IS NULL AND thumbnail_failure IS NULL"""


def noisy_png(at_most: int, seed: int) -> bytes:
    """A PNG of random pixels just under ``at_most`` bytes."""
    side = max(8, int((at_most / 3) ** 0.5))
    while True:
        noise = random.Random(seed).randbytes(side * side * 3)  # noqa: S311 - pixels
        buffer = io.BytesIO()
        Image.frombytes("RGB", (side, side), noise).save(buffer, "PNG", compress_level=1)
        if buffer.tell() <= at_most:
            return buffer.getvalue()
        side = int(side * 0.98)


async def land(client: MediaClient, transfer: ObjectTransfer, data: bytes) -> None:
    owner, key = str(uuid.uuid4()), f"bench:{uuid.uuid4()}"
    upload = await client.reserve_output(
        owner, "image/png", len(data), hashlib.sha256(data).hexdigest(), key
    )
    await transfer.upload(upload, data)
    await client.complete_output(owner, upload.asset_id, key)


async def thumbnails_done(database_url: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        while await connection.fetchval(WITHOUT_THUMBNAIL):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    finally:
        await connection.close()


async def measure(address: str, pid: int, database_url: str, rounds: int, thumbnails: bool) -> None:
    client = MediaClient(address, DEV_SERVICE_TOKEN, timeout_seconds=30)
    transfer = ObjectTransfer(timeout_seconds=120)
    try:
        for name, size in SIZES:
            outputs = [noisy_png(size, seed) for seed in range(rounds + 1)]
            await land(client, transfer, outputs[0])  # warm-up: first use of each part
            if thumbnails:
                await thumbnails_done(database_url)
            before = memory_kib(pid)["VmRSS"]
            reset_peak(pid)
            for data in outputs[1:]:
                await land(client, transfer, data)
            landed_peak = memory_kib(pid)["VmHWM"]
            mean = sum(map(len, outputs[1:])) / rounds / MIB
            line = (
                f"{name:>8} outputs ({mean:.2f} MiB each, {rounds}): media RSS before"
                f" {before / KIB:.1f} MiB; peak while landing +{(landed_peak - before) / KIB:.1f}"
                " MiB"
            )
            if thumbnails:
                reset_peak(pid)
                await thumbnails_done(database_url)
                peak = memory_kib(pid)["VmHWM"]
                line += f" (thumbnails made meanwhile); after it +{(peak - before) / KIB:.1f} MiB"
            print(line, flush=True)
    finally:
        await transfer.close()
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=("local", "s3"), default="local")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--thumbnails",
        choices=("on", "off"),
        default="off",
        help="off: the landing path alone; on: media's thumbnail maker runs as in service",
    )
    args = parser.parse_args()
    work = scratch_folder("atelier-memory-")
    admin_url = os.environ.get("ATELIER_TEST_POSTGRES_URL") or LOCAL_POSTGRES
    if not postgres.server_answers(admin_url):
        admin_url = postgres.start_embedded(work / "pg")
    database = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    database_url = postgres.ensure_database(admin_url, database)
    migrations.upgrade("media", database_url)
    moto = None
    env = {
        "ATELIER_ENV": "dev",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_LOG_LEVEL": "WARNING",
        "ATELIER_MEDIA_LOCAL_DIR": str(work / "objects"),
        # A loaded machine: the bench measures memory, not deadlines.
        "ATELIER_CALL_DEADLINE": "30",
        "ATELIER_DB_STATEMENT_TIMEOUT": "10",
        "ATELIER_MEDIA_THUMBNAIL_BACKFILL_BATCH": "20" if args.thumbnails == "on" else "0",
    }
    if args.storage == "s3":
        moto, s3_env = start_moto()
        env.update(s3_env)
    ports = {name: free_port() for name in ("PUBLIC", "INTERNAL", "METRICS", "HTTP")}
    for name, number in ports.items():
        env[f"ATELIER_MEDIA_{name}_PORT"] = str(number)
    env["ATELIER_MEDIA_PUBLIC_BASE_URL"] = f"http://127.0.0.1:{ports['HTTP']}"
    print(
        f"media memory per output size, storage {args.storage}, thumbnails {args.thumbnails}",
        flush=True,
    )
    media = spawn("media", [sys.executable, "-m", "services.media"], env, work / "logs")
    try:
        wait_until(media, grpc_serving(f"127.0.0.1:{ports['INTERNAL']}"), 60)
        asyncio.run(
            measure(
                f"127.0.0.1:{ports['INTERNAL']}",
                media.process.pid,
                database_url,
                args.rounds,
                args.thumbnails == "on",
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
