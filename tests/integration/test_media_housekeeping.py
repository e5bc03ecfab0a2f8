"""Housekeeping removes uploads that were never completed within their expiry — rows
marked deleted, objects gone — with several housekeepers at once taking each row once;
and a server-side store that fails half-way leaves nothing that looks ready."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from datetime import datetime
from pathlib import Path

import grpc
import httpx
import pytest
from aiobotocore.session import AioSession
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.kit.auth import issue_token
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.media.assets import Assets, Limits
from services.media.domain import Asset, Purpose, Status, thumbnail_key
from services.media.housekeeping import DEFAULT_ABANDONED_WRITE_AGE, Housekeeper
from services.media.images import ImageInspector
from services.media.settings import S3Settings
from services.media.storage.local import INCOMING, PART_SUFFIX, LocalStorage
from services.media.storage.s3 import S3Storage
from services.media.storage.signing import UrlSigner
from services.media.store.assets import AssetStore
from tests.support.media import (
    FakeClock,
    MediaHarness,
    image_bytes,
    media_settings,
    running_media,
    until,
)
from tests.support.rpc import bearer, error_info

ALICE = bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600))
JPEG = image_bytes("JPEG", 32, 32)
PNG = image_bytes("PNG", 24, 24)
SERVICE = (("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)


@pytest.fixture
async def media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path)) as harness:
        yield harness


async def reserve(stub: media_service_pb2_grpc.MediaServiceStub, send_bytes: bool) -> str:
    upload = await stub.CreateUpload(
        media_service_pb2.CreateUploadRequest(
            purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
            content_type="image/jpeg",
            size_bytes=len(JPEG),
        ),
        metadata=ALICE,
    )
    if send_bytes:
        async with httpx.AsyncClient() as client:
            response = await client.put(
                upload.upload_url, content=JPEG, headers=dict(upload.upload_headers)
            )
        assert response.status_code == 200
    return upload.asset.asset_id


async def test_expired_uploads_are_removed_once_by_concurrent_housekeepers(
    media: MediaHarness,
) -> None:
    async with media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        abandoned = [await reserve(stub, send_bytes=i % 2 == 0) for i in range(9)]
        completed = await reserve(stub, send_bytes=True)
        await stub.CompleteUpload(
            media_service_pb2.CompleteUploadRequest(asset_id=completed), metadata=ALICE
        )
        media.clock.advance(media.settings.upload_url_ttl_seconds + 1)
        recent = await reserve(stub, send_bytes=True)  # its time has not run out

        keys = {}
        for asset_id in abandoned:
            stored = await media.store.get(uuid.UUID(asset_id))
            assert stored is not None
            keys[asset_id] = stored.object_key

        # Two replicas sweep at the same moment, in small batches.
        first, second = await asyncio.gather(
            media.housekeeper(batch_size=2).sweep(), media.housekeeper(batch_size=3).sweep()
        )
        assert not set(first) & set(second)
        assert {uuid.UUID(a) for a in abandoned} <= set(first) | set(second)

        for asset_id in abandoned:
            stored = await media.store.get(uuid.UUID(asset_id))
            assert stored is not None
            assert stored.status == Status.DELETED and stored.deleted_at == media.clock.now
            assert await media.storage.stat(keys[asset_id]) is None
        for asset_id, status in ((completed, Status.READY), (recent, Status.UPLOADING)):
            stored = await media.store.get(uuid.UUID(asset_id))
            assert stored is not None and stored.status == status
            assert await media.storage.stat(stored.object_key) is not None

        # Nothing is left to sweep; a late completion is told the upload expired.
        assert await media.housekeeper(batch_size=10).sweep() == []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CompleteUpload(
                media_service_pb2.CompleteUploadRequest(asset_id=abandoned[0]), metadata=ALICE
            )
        assert error_info(caught.value).reason == "UPLOAD_EXPIRED"


class FailingStorage(LocalStorage):
    """A real local store whose writes break off after the first chunk, as a full disk or
    a lost S3 connection would."""

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        async def first_then_fail() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                yield chunk
                raise OSError("no space left on device")

        await super().put(key, first_then_fail(), content_type)


async def test_a_store_that_fails_half_way_leaves_a_deleted_row_and_no_object(
    media: MediaHarness, tmp_path: Path
) -> None:
    storage = FailingStorage(tmp_path / "failing", UrlSigner("x" * 40, "http://127.0.0.1:1"))
    assets = Assets(
        media.store,
        storage,
        ImageInspector(max_pixels=1_000_000),
        Limits(
            upload_url_ttl_seconds=900,
            download_url_ttl_seconds=300,
            max_upload_bytes=1024 * 1024,
            chunk_bytes=4096,
        ),
    )
    owner = f"owner-{uuid.uuid4()}"
    png = image_bytes("PNG", 200, 200)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(png), 4096):
            yield png[start : start + 4096]

    with pytest.raises(OSError, match="no space"):
        await assets.put(owner, Purpose.AI_OUTPUT, "image/png", chunks())
    async with media.engine.connect() as connection:
        rows = (
            await connection.execute(
                text("SELECT status, object_key FROM media.assets WHERE owner_user_id = :o"),
                {"o": owner},
            )
        ).all()
    assert [row.status for row in rows] == ["deleted"]
    assert await storage.stat(rows[0].object_key) is None
    assert [p for p in storage.root.rglob("*") if p.is_file()] == []


# -- orphans a crash leaves behind ---------------------------------------------------------


async def put_png(media: MediaHarness, owner: str) -> Asset:
    """A ready asset, stored through PutAsset as a worker would."""

    async def messages() -> AsyncIterator[pb.PutAssetRequest]:
        yield pb.PutAssetRequest(
            header=pb.PutAssetHeader(
                owner_user_id=owner,
                purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                content_type="image/png",
            )
        )
        yield pb.PutAssetRequest(chunk=PNG)

    async with media.internal_channel() as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.PutAsset(messages(), metadata=SERVICE)
    stored = await media.store.get(uuid.UUID(reply.asset.asset_id))
    assert stored is not None
    return stored


async def test_objects_of_deleted_assets_are_removed_once_in_batches(
    any_media: MediaHarness,
) -> None:
    media = any_media
    owner = f"owner-{uuid.uuid4()}"
    orphans = [await put_png(media, owner) for _ in range(7)]
    kept = await put_png(media, owner)
    # Each output gets its thumbnail from the thumbnail maker, beside its object.
    await media.make_thumbnails()
    for asset in [*orphans, kept]:
        assert await media.storage.stat(thumbnail_key(asset.object_key)) is not None
    for asset in orphans:
        # What a crash between DeleteAsset's two steps leaves: the row says deleted, the
        # object is still there.
        assert await media.store.mark_deleted(asset.asset_id, media.clock.now) is not None
        assert await media.storage.stat(asset.object_key) is not None

    # Two replicas at once, in small batches: each object is removed by exactly one.
    first, second = await asyncio.gather(
        media.housekeeper(batch_size=2).purge_deleted(media.clock.now),
        media.housekeeper(batch_size=3).purge_deleted(media.clock.now),
    )
    # Each output's thumbnail is left behind with it, and removed with it.
    assert first.objects_removed + second.objects_removed == 2 * len(orphans)
    for asset in orphans:
        assert await media.storage.stat(asset.object_key) is None
        assert await media.storage.stat(thumbnail_key(asset.object_key)) is None
    assert await media.storage.stat(kept.object_key) is not None
    assert await media.storage.stat(thumbnail_key(kept.object_key)) is not None

    # PutAsset's rows carry an upload expiry: until it (and the write grace) passed, the
    # rows stay watched; then one sweep settles them and later sweeps leave them alone.
    assert {await purged_at(media, a) for a in orphans} == {None}
    media.clock.advance(media.settings.upload_url_ttl_seconds + 3600)
    await media.housekeeper(batch_size=2).sweep()
    assert {await purged_at(media, a) for a in orphans} == {media.clock.now}
    assert await purged_at(media, kept) is None
    assert (await media.housekeeper(batch_size=2).purge_deleted(media.clock.now)).settled == 0


async def purged_at(media: MediaHarness, asset: Asset) -> datetime | None:
    async with media.engine.connect() as connection:
        found = await connection.execute(
            text("SELECT object_purged_at FROM media.assets WHERE asset_id = :a"),
            {"a": asset.asset_id},
        )
        value: datetime | None = found.scalar_one()
    return value


def leftover_part(incoming: Path, age_seconds: float, data: bytes = b"") -> Path:
    """A ``.part`` file as a crash leaves it: opened, maybe partly written, never linked."""
    path = incoming / f"{uuid.uuid4()}{PART_SUFFIX}"
    with path.open("xb") as file:
        file.write(data)
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))
    return path


async def test_stale_part_files_are_swept_in_batches_and_fresh_ones_survive(
    media_url: str, tmp_path: Path
) -> None:
    # No running media: its loop's first sweep would race this one for the files.
    storage = LocalStorage(tmp_path / "objects", UrlSigner("s" * 40, "http://127.0.0.1:9"))
    engine = create_async_engine(asyncpg_url(media_url))
    incoming = storage.root / INCOMING
    age = DEFAULT_ABANDONED_WRITE_AGE.total_seconds()
    stale = [leftover_part(incoming, age + 60) for _ in range(4)]
    stale.append(leftover_part(incoming, 3 * age, data=b"half an upload"))
    fresh = leftover_part(incoming, age - 60, data=b"still arriving")
    unrelated = incoming / "README"
    unrelated.write_text("not a write of ours")
    os.utime(unrelated, (0, 0))

    clock = FakeClock()
    housekeeper = Housekeeper(
        AssetStore(engine),
        storage,
        period_seconds=60,
        batch_size=2,
        abandoned_write_age=DEFAULT_ABANDONED_WRITE_AGE,
        clock=clock,
    )
    try:
        assert await housekeeper.remove_abandoned_writes(clock.now) == len(stale)
        assert not any(path.exists() for path in stale)
        assert fresh.exists() and unrelated.exists()
        assert await housekeeper.remove_abandoned_writes(clock.now) == 0
    finally:
        await engine.dispose()


async def test_the_housekeeping_loop_sweeps_part_files_at_start(
    media_url: str, tmp_path: Path
) -> None:
    settings = media_settings(media_url, tmp_path, MEDIA_ABANDONED_WRITE_AGE="60")
    incoming = settings.local_dir / INCOMING
    incoming.mkdir(parents=True)
    stale = leftover_part(incoming, 120)
    fresh = leftover_part(incoming, 0)
    async with running_media(settings):
        await until(lambda: not stale.exists())
    assert fresh.exists()


async def test_s3_abandoned_multipart_uploads_are_aborted_in_batches(
    s3_bucket: S3Settings, media_url: str
) -> None:
    storage = S3Storage(s3_bucket)
    engine = create_async_engine(asyncpg_url(media_url))
    clock = FakeClock()
    # No running media: its own first sweep would race this test for the uploads.
    housekeeper = Housekeeper(
        AssetStore(engine), storage, period_seconds=60, batch_size=2, clock=clock
    )
    session = AioSession()
    try:
        async with session.create_client(
            "s3",
            endpoint_url=s3_bucket.endpoint_url,
            region_name=s3_bucket.region,
            aws_access_key_id=s3_bucket.access_key_id,
            aws_secret_access_key=s3_bucket.secret_access_key,
        ) as client:
            for _ in range(3):  # what a PutAsset killed mid-stream leaves
                await client.create_multipart_upload(Bucket=s3_bucket.bucket, Key="ai_output/x")
            listed = await client.list_multipart_uploads(Bucket=s3_bucket.bucket)
            # moto reports a fixed initiation time: judge the age from what it says.
            clock.now = max(upload["Initiated"] for upload in listed["Uploads"])
            clock.advance(600)
            assert await housekeeper.remove_abandoned_writes(clock.now) == 0
            clock.advance(DEFAULT_ABANDONED_WRITE_AGE.total_seconds())
            assert await housekeeper.remove_abandoned_writes(clock.now) == 3
            listed = await client.list_multipart_uploads(Bucket=s3_bucket.bucket)
            assert listed.get("Uploads", []) == []
    finally:
        await storage.close()
        await engine.dispose()
