"""media's CPU per operation on a job's path: what one generation costs media.

A worker reads the input photo (ReadAsset) and lands each output (PutAsset, with an
idempotency key); the creation API checks the input at submit (GetAssetInfo). This bench
starts media as its own process (local storage, or S3 on an in-process moto server with
``--storage s3``) on a throwaway database, runs each operation ``--ops`` times with
``--concurrency`` calls in flight, and prints the CPU milliseconds media spent per
operation (from /proc, see bench/cpu.py) beside a bare grpc.aio echo server's per call
with the same payload (bench/anchors.py), measured in the same run, and the CPU the
calling process (this bench) spent per call. The "worker" rows make the calls through
creation's media client, as a worker does. The "output path" row (local storage) is a
job's media traffic on the in-process worker's path today: the input's GET from its
signed URL, ReserveOutputUpload, the PUT to the signed URL, CompleteOutputUpload, and the
thumbnail media makes afterwards (its CPU counted: the row waits for it;
``ATELIER_MEDIA_THUMBNAIL_BACKFILL_BATCH=0`` leaves thumbnails out):

    .venv/bin/python -m bench.media_job_path [--ops 2000] [--storage local|s3]
        [--only "output path"] [--concurrency 8]

Images: the end-to-end bench's photo (a 64x64 PNG), a small photo-like JPEG (~20 KB)
and a ~1 MB JPEG.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
import httpx
from PIL import Image

from atelier.media.v1 import asset_pb2, media_internal_service_pb2_grpc
from atelier.media.v1 import media_internal_service_pb2 as pb
from bench.anchors import echo_call, echo_server
from bench.cpu import CpuMeter
from bench.end_to_end import WITHOUT_THUMBNAIL
from bench.media_throughput import LOCAL_POSTGRES, big_jpeg, start_moto
from bench.scratch import scratch_folder
from services.creation.media_client import MediaClient
from services.creation.object_transfer import ObjectTransfer
from services.dev import postgres
from services.dev.processes import free_port, grpc_serving, spawn, wait_until
from services.kit import migrations
from services.kit.listen import asyncpg_dsn
from services.kit.settings import DEV_SERVICE_TOKEN

MIB = 1024 * 1024
CHUNK_BYTES = 256 * 1024  # as creation's media client sends
AUTH = (("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)


@dataclass(frozen=True)
class Sample:
    name: str
    content_type: str
    data: bytes


def samples() -> list[Sample]:
    png = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(png, "PNG")
    rng = random.Random(2)  # noqa: S311 - pixels, not secrets
    small = Image.frombytes("RGB", (160, 120), rng.randbytes(160 * 120 * 3))
    jpeg = io.BytesIO()
    small.save(jpeg, "JPEG", quality=90)
    return [
        Sample("png-64px", "image/png", png.getvalue()),
        Sample("jpeg-small", "image/jpeg", jpeg.getvalue()),
        Sample("jpeg-1MB", "image/jpeg", big_jpeg(1_000_000)),
    ]


async def run_ops(ops: int, concurrency: int, once: Callable[[int], Awaitable[None]]) -> float:
    """Runs ``once(i)`` for i in 0..ops-1 with ``concurrency`` in flight; wall seconds."""
    counter = iter(range(ops))

    async def lane() -> None:
        for index in counter:
            await once(index)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - started


async def measure(internal: str, media_pid: int, echo: str, args: argparse.Namespace) -> None:
    echo_pid = int(echo.split("|")[1])
    echo_address = echo.split("|")[0]
    options = [("grpc.max_receive_message_length", 16 * MIB)]
    media_meter = CpuMeter({"media": lambda: [media_pid]})
    echo_meter = CpuMeter({"echo": lambda: [echo_pid]})
    run = uuid.uuid4().hex[:8]
    async with (
        grpc.aio.insecure_channel(internal, options=options) as channel,
        grpc.aio.insecure_channel(echo_address, options=options) as echo_channel,
    ):
        media = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        call = echo_call(echo_channel)

        print(
            f"{'operation':28} {'media ms/op':>11} {'echo ms/op':>10} {'ratio':>6} {'ops/s':>7}"
            f" {'client ms/op':>10}",
            flush=True,
        )
        for sample in samples():
            await run_sample(media, call, sample, args, run, media_meter, echo_meter)


Op = Callable[[int], Awaitable[None]]


async def run_sample(
    media: Any,
    call: Any,
    sample: Sample,
    args: argparse.Namespace,
    run: str,
    media_meter: CpuMeter,
    echo_meter: CpuMeter,
) -> None:
    ops = args.ops if len(sample.data) < 100_000 else max(50, args.ops // 10)
    stored: list[str] = []

    def parts(key: str) -> AsyncIterator[pb.PutAssetRequest]:
        async def generate() -> AsyncIterator[pb.PutAssetRequest]:
            yield pb.PutAssetRequest(
                header=pb.PutAssetHeader(
                    owner_user_id="bench-user",
                    purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                    content_type=sample.content_type,
                    idempotency_key=key,
                )
            )
            for start in range(0, len(sample.data), CHUNK_BYTES):
                yield pb.PutAssetRequest(chunk=sample.data[start : start + CHUNK_BYTES])

        return generate()

    async def put(index: int) -> None:
        reply = await media.PutAsset(parts(f"bench:{run}:{sample.name}:{index}"), metadata=AUTH)
        assert reply.asset.status == asset_pb2.ASSET_STATUS_READY
        stored.append(reply.asset.asset_id)

    async def put_plain(index: int) -> None:
        reply = await media.PutAsset(parts(""), metadata=AUTH)
        assert reply.asset.status == asset_pb2.ASSET_STATUS_READY
        stored.append(reply.asset.asset_id)

    async def read(index: int) -> None:
        received = 0
        async for message in media.ReadAsset(
            pb.ReadAssetRequest(asset_id=stored[index % len(stored)]), metadata=AUTH
        ):
            received += len(message.chunk)
        assert received == len(sample.data)

    async def info(index: int) -> None:
        reply = await media.GetAssetInfo(
            pb.GetAssetInfoRequest(asset_id=stored[index % len(stored)]), metadata=AUTH
        )
        assert reply.asset.status == asset_pb2.ASSET_STATUS_READY

    async def echo_same(index: int) -> None:
        await call(sample.data, metadata=AUTH)

    async def echo_small(index: int) -> None:
        await call(b"x" * 40, metadata=AUTH)

    worker = MediaClient(args.internal, DEV_SERVICE_TOKEN, timeout_seconds=30)

    async def worker_put(index: int) -> None:
        key = f"bench:{run}:worker:{sample.name}:{index}"
        asset_id = await worker.put_asset(
            "bench-user", "ai_output", sample.content_type, sample.data, idempotency_key=key
        )
        stored.append(asset_id)

    async def worker_read(index: int) -> None:
        read = await worker.read_asset(stored[index % len(stored)], 16 * MIB)
        assert len(read.data) == len(sample.data)

    transfer = ObjectTransfer()
    digest = hashlib.sha256(sample.data).hexdigest()

    async def worker_land(index: int) -> None:
        # A worker's output as it lands today: reserved, PUT to the signed URL, committed
        # (concurrent lanes share the client's batched calls where it has them).
        key = f"bench:{run}:land:{sample.name}:{uuid.uuid4().hex}"  # never a replay
        upload = await worker.reserve_output(
            "bench-user", sample.content_type, len(sample.data), digest, key
        )
        await transfer.upload(upload, sample.data)
        await worker.complete_output("bench-user", upload.asset_id, key)

    http = httpx.AsyncClient(timeout=30)
    input_url = ""

    async def output_path(index: int) -> None:
        """A job's media traffic on the in-process worker's path: the input's GET from
        its signed URL, the output reserved, PUT to its signed URL and committed (media
        makes its thumbnail afterwards, counted: see the phase loop)."""
        nonlocal input_url
        if not input_url:  # the input: an image an earlier phase stored
            signed = await media.GetAssetUrl(
                pb.GetAssetUrlRequest(asset_id=stored[0]), metadata=AUTH
            )
            input_url = signed.download_url
        got = await http.get(input_url)
        assert got.status_code == 200, got.status_code
        key = f"bench:{run}:output:{sample.name}:{uuid.uuid4().hex}"
        reserved = await media.ReserveOutputUpload(
            pb.ReserveOutputUploadRequest(
                owner_user_id="bench-user",
                content_type=sample.content_type,
                size_bytes=len(sample.data),
                sha256=digest,
                idempotency_key=key,
            ),
            metadata=AUTH,
        )
        sent = await http.put(
            reserved.upload_url, content=sample.data, headers=dict(reserved.upload_headers)
        )
        assert sent.status_code == 200, sent.status_code
        done = await media.CompleteOutputUpload(
            pb.CompleteOutputUploadRequest(
                asset_id=reserved.asset.asset_id, owner_user_id="bench-user", idempotency_key=key
            ),
            metadata=AUTH,
        )
        assert done.asset.status == asset_pb2.ASSET_STATUS_READY

    phases: list[tuple[str, Op, Op]] = [
        (f"PutAsset keyed {sample.name}", put, echo_same),
        (f"PutAsset {sample.name}", put_plain, echo_same),
        (f"ReadAsset {sample.name}", read, echo_same),
    ]
    if sample.name == "png-64px":
        phases.append(("GetAssetInfo", info, echo_small))
        # The same calls through creation's media client, as a worker makes them.
        phases.append((f"worker put_asset {sample.name}", worker_put, echo_same))
        phases.append((f"worker read_asset {sample.name}", worker_read, echo_same))
        phases.append((f"worker lands output {sample.name}", worker_land, echo_same))

        if args.storage == "local":
            phases.append((f"output path {sample.name}", output_path, echo_same))
    if args.only and "PutAsset" not in args.only:
        await run_ops(20, 1, put_plain)  # something to read
    for name, once, anchor in phases:
        if args.only and args.only not in name:
            continue
        await run_ops(min(ops, 50), args.concurrency, once)  # warm up
        media_meter.start()
        client_before = time.process_time()
        wall = await run_ops(ops, args.concurrency, once)
        client = (time.process_time() - client_before) * 1000 / ops
        if once is output_path and os.environ.get("ATELIER_MEDIA_THUMBNAIL_BACKFILL_BATCH") != "0":
            # media makes an output's thumbnail after its commit: counted too.
            await _thumbnails_made(args.database_url)
        spent = media_meter.per_op(ops)["media"]
        echo_meter.start()
        await run_ops(ops, args.concurrency, anchor)
        echo_spent = echo_meter.per_op(ops)["echo"]
        print(
            # Too few ops for the clock's ticks leave the anchor at 0: no ratio then.
            f"{name:28} {spent:11.3f} {echo_spent:10.3f}"
            f" {spent / echo_spent if echo_spent else float('nan'):6.1f}"
            f" {ops / wall:7.0f} {client:10.3f}",
            flush=True,
        )
    await http.aclose()


async def _thumbnails_made(database_url: str) -> None:
    """Returns once media has made every output's thumbnail (in the background)."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        while await connection.fetchval(WITHOUT_THUMBNAIL):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    finally:
        await connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", choices=("local", "s3"), default="local")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--only", default="", help="run only phases whose name has this")
    args = parser.parse_args()

    work = scratch_folder("atelier-bench-")
    admin_url = os.environ.get("ATELIER_TEST_POSTGRES_URL") or LOCAL_POSTGRES
    if not postgres.server_answers(admin_url):
        admin_url = postgres.start_embedded(work / "pg")
    database = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    database_url = postgres.ensure_database(admin_url, database)
    migrations.upgrade("media", database_url)
    args.database_url = database_url

    moto = None
    env = {
        "ATELIER_ENV": "dev",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_LOG_LEVEL": "WARNING",
        "ATELIER_MEDIA_LOCAL_DIR": str(work / "objects"),
    }
    if args.storage == "s3":
        moto, s3_env = start_moto()
        env.update(s3_env)
    ports = {name: free_port() for name in ("PUBLIC", "INTERNAL", "METRICS", "HTTP")}
    for name, number in ports.items():
        env[f"ATELIER_MEDIA_{name}_PORT"] = str(number)
    env["ATELIER_MEDIA_PUBLIC_BASE_URL"] = f"http://127.0.0.1:{ports['HTTP']}"
    print(
        f"media job path: storage {args.storage}, {args.ops} ops per phase (1 MB: a tenth),"
        f" {args.concurrency} in flight; {os.cpu_count()} CPUs, Python"
        f" {sys.version.split()[0]}",
        flush=True,
    )
    media = spawn("media", [sys.executable, "-m", "services.media"], env, work / "logs")
    try:
        wait_until(media, grpc_serving(f"127.0.0.1:{ports['PUBLIC']}"), 60)
        with echo_server() as echo:
            echo_pid = _pid_listening(echo)
            args.internal = f"127.0.0.1:{ports['INTERNAL']}"
            asyncio.run(
                measure(
                    f"127.0.0.1:{ports['INTERNAL']}",
                    media.process.pid,
                    f"{echo}|{echo_pid}",
                    args,
                )
            )
    finally:
        media.stop()
        if moto is not None:
            moto.stop()  # type: ignore[attr-defined]
        postgres.drop_database(admin_url, database)
    return 0


def _pid_listening(address: str) -> int:
    """The pid of the process listening on ``address`` (the echo server child)."""
    port = int(address.rsplit(":", 1)[1])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"echo-server" in cmdline and str(port).encode() in cmdline:
            return int(entry.name)
    raise RuntimeError("the echo server's pid was not found")


if __name__ == "__main__":
    sys.exit(main())
