"""Housekeeping removes uploads that were never completed within their expiry — rows
marked deleted, objects gone — with several housekeepers at once taking each row once;
and a server-side store that fails half-way leaves nothing that looks ready."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy import text

from atelier.media.v1 import asset_pb2, media_service_pb2, media_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from services.media.assets import Assets, Limits
from services.media.images import ImageInspector
from services.media.model import Purpose, Status
from services.media.storage.local import LocalStorage
from services.media.storage.signing import UrlSigner
from tests.support.media import (
    MediaHarness,
    image_bytes,
    media_settings,
    running_media,
)
from tests.support.rpc import bearer, error_info

ALICE = bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600))
JPEG = image_bytes("JPEG", 32, 32)


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
