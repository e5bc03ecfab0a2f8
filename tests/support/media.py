"""Helpers for media tests: real images made with Pillow, a pixel bomb written byte by
byte, a clock the test moves, and a database of media's own."""

from __future__ import annotations

import asyncio
import io
import random
import struct
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from PIL import Image
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.media.v1 import asset_pb2, media_service_pb2, media_service_pb2_grpc
from services.dev import postgres
from services.dev.processes import free_port
from services.kit import migrations
from services.kit.db import asyncpg_url
from services.kit.errors import DOMAIN
from services.kit.server import RunningService
from services.kit.settings import ListenSettings
from services.media.app import build, open_storage
from services.media.housekeeping import Housekeeper
from services.media.settings import MediaSettings
from services.media.storage import ObjectStorage
from services.media.store.assets import AssetStore
from services.media.thumbnail_backfill import ThumbnailBackfill
from services.media.thumbnails import Thumbnailer


def image_bytes(fmt: str, width: int = 64, height: int = 48, **save: object) -> bytes:
    """A small real image: a colour gradient, so encoders have something to encode."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [((x * 4) % 256, (y * 4) % 256, 128) for y in range(height) for x in range(width)]
    )
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save)
    return buffer.getvalue()


def noisy_jpeg(min_bytes: int, seed: int = 7) -> bytes:
    """A JPEG of at least ``min_bytes``: random pixels barely compress."""
    side = 256
    while True:
        noise = random.Random(seed).randbytes(side * side * 3)
        image = Image.frombytes("RGB", (side, side), noise)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=95)
        if buffer.tell() >= min_bytes:
            return buffer.getvalue()
        side = int(side * 1.25) + 8


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def pixel_bomb_png(width: int, height: int) -> bytes:
    """A valid PNG that claims (and decodes to) ``width`` x ``height`` black 1-bit pixels,
    yet is only kilobytes long: what a decompression bomb looks like."""
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed pixels
    packer = zlib.compressobj(9)
    compressed = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", compressed)
        + _png_chunk(b"IEND", b"")
    )


class FakeClock:
    """The time, as far as the code under test knows; starts at the real time."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@contextmanager
def media_database(admin_url: str) -> Iterator[str]:
    """A database with media's schema only: no other test's rows, no other housekeeper."""
    name = f"atelier_media_{uuid.uuid4().hex[:12]}"
    url = postgres.ensure_database(admin_url, name)
    try:
        migrations.upgrade("media", url)
        yield url
    finally:
        postgres.drop_database(admin_url, name)


def noisy_png(width: int, height: int, seed: int = 3) -> bytes:
    """A PNG that barely compresses, so it spans several chunks."""
    noise = random.Random(seed).randbytes(width * height * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), noise).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass
class MediaHarness:
    """media running in this process on real listeners: gRPC public and internal, and
    (local backend) its object HTTP listener, over its own database."""

    running: RunningService
    settings: MediaSettings
    storage: ObjectStorage
    store: AssetStore
    engine: AsyncEngine
    clock: FakeClock

    def public_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.running.public_port}")

    def internal_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.running.internal_port}")

    def housekeeper(self, batch_size: int) -> Housekeeper:
        return Housekeeper(
            self.store, self.storage, period_seconds=60, batch_size=batch_size, clock=self.clock
        )

    async def make_thumbnails(self) -> int:
        """One round of the thumbnail maker (off in these tests unless a test turns it
        on): every ready output without a thumbnail gets one. How many were made."""
        backfill = ThumbnailBackfill(
            self.store,
            self.storage,
            Thumbnailer(self.settings.max_image_pixels),
            batch=1000,
            chunk_bytes=self.settings.chunk_bytes,
        )
        return (await backfill.run(self.clock.now)).made


def media_settings(database_url: str, work: Path, **extra: str) -> MediaSettings:
    http_port = free_port()
    return MediaSettings.from_env(
        {
            "ATELIER_DATABASE_URL": database_url,
            "ATELIER_DRAIN_GRACE": "0",
            "ATELIER_MEDIA_LOCAL_DIR": str(work / "objects"),
            "ATELIER_MEDIA_HTTP_PORT": str(http_port),
            "ATELIER_MEDIA_PUBLIC_BASE_URL": f"http://127.0.0.1:{http_port}",
            # Tests sweep when they choose to; the loop's first sweep runs at start only.
            "ATELIER_MEDIA_HOUSEKEEPING_PERIOD": "3600",
            # Nor does the thumbnail maker run (it would also take rows a test wrote as
            # old outputs): a test makes thumbnails with make_thumbnails, or turns it on.
            "ATELIER_MEDIA_THUMBNAIL_BACKFILL_BATCH": "0",
            # Decoding and storing a picture can outlast the 3 s default on a loaded
            # machine; the tests whose subject is a deadline set their own.
            "ATELIER_CALL_DEADLINE": "10",
            **{f"ATELIER_{name}": value for name, value in extra.items()},
        }
    )


@asynccontextmanager
async def running_media(
    settings: MediaSettings, storage: ObjectStorage | None = None
) -> AsyncIterator[MediaHarness]:
    clock = FakeClock()
    storage = storage or open_storage(settings)
    app = build(settings, storage=storage, clock=clock)
    running = RunningService(app, settings.common, ListenSettings(0, 0, 0))
    engine = create_async_engine(asyncpg_url(settings.common.database_url))
    await running.start()
    try:
        yield MediaHarness(running, settings, storage, AssetStore(engine), engine, clock)
    finally:
        await running.stop()
        await engine.dispose()


def http_status(response: httpx.Response) -> tuple[int, str]:
    """The google.rpc.Status in an HTTP answer's JSON body: (its code, its ErrorInfo
    reason). Fails unless the body is one, with ErrorInfo in our domain."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    status = json_format.ParseDict(response.json(), status_pb2.Status(), ignore_unknown_fields=True)
    infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1, response.text
    info = error_details_pb2.ErrorInfo()
    infos[0].Unpack(info)
    assert info.domain == DOMAIN
    assert response.json()["error"] == info.reason  # the first version's field, kept
    return status.code, info.reason


@dataclass(frozen=True)
class SignedUrls:
    """A ready asset's upload and download URLs, as its owner was handed them."""

    asset_id: str
    object_key: str
    upload_url: str
    upload_headers: dict[str, str]
    download_url: str
    data: bytes


async def create_upload(
    media: MediaHarness, token: str, data: bytes
) -> media_service_pb2.CreateUploadResponse:
    """An upload of ``data`` (a JPEG) reserved through media's public listener."""
    async with media.public_channel() as channel:
        return await media_service_pb2_grpc.MediaServiceStub(channel).CreateUpload(
            media_service_pb2.CreateUploadRequest(
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                content_type="image/jpeg",
                size_bytes=len(data),
            ),
            metadata=(("authorization", f"Bearer {token}"),),
        )


async def ready_asset(media: MediaHarness, token: str, data: bytes) -> SignedUrls:
    """Creates an upload, PUTs ``data`` (a JPEG), completes it and asks for its download
    URL, all through media's real listeners."""
    metadata = (("authorization", f"Bearer {token}"),)
    upload = await create_upload(media, token, data)
    headers = dict(upload.upload_headers)
    async with media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        async with httpx.AsyncClient() as client:
            sent = await client.put(upload.upload_url, content=data, headers=headers)
        assert sent.status_code == 200, sent.text
        asset_id = upload.asset.asset_id
        await stub.CompleteUpload(
            media_service_pb2.CompleteUploadRequest(asset_id=asset_id), metadata=metadata
        )
        got = await stub.GetAsset(
            media_service_pb2.GetAssetRequest(asset_id=asset_id), metadata=metadata
        )
    stored = await media.store.get(uuid.UUID(asset_id))
    assert stored is not None
    return SignedUrls(
        asset_id, stored.object_key, upload.upload_url, headers, got.download_url, data
    )


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Polls a condition that nothing signals (a file another task creates), with a
    deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        if condition():
            return
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)
