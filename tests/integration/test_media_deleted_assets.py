"""A deleted asset's signed URLs stop working and its object does not come back.

Local backend: media's own listener checks the asset's state, so an upload URL of a
deleted asset is refused (also for bytes that were arriving while it was deleted) and a
download URL answers 404. S3: a presigned URL cannot be revoked, so a PUT after the
deletion succeeds at S3; housekeeping removes that object at its next sweep, keeps
watching the asset until its upload URL cannot add one any more, then settles it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from atelier.media.v1 import media_internal_service_pb2 as pb
from atelier.media.v1 import media_internal_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.media.domain import Status
from services.media.housekeeping import DEFAULT_ABANDONED_WRITE_AGE
from services.media.http import READ_BYTES
from services.media.settings import S3Settings
from services.media.storage.local import INCOMING
from services.media.storage.s3 import S3Storage
from tests.support.media import (
    MediaHarness,
    create_upload,
    http_status,
    image_bytes,
    media_settings,
    ready_asset,
    running_media,
    until,
)

ALICE = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)
SERVICE = (("authorization", f"Bearer {DEV_SERVICE_TOKEN}"),)
FIRST = image_bytes("JPEG", 40, 30)
# Other bytes of the same length: the upload URL signs the size.
SECOND = bytes(reversed(FIRST))


@pytest.fixture
async def local_media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path)) as harness:
        yield harness


@pytest.fixture
async def s3_media(
    s3_bucket: S3Settings, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    settings = media_settings(media_url, tmp_path)
    async with running_media(settings, S3Storage(s3_bucket)) as harness:
        yield harness


async def delete_asset(media: MediaHarness, asset_id: str) -> None:
    async with media.internal_channel() as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.DeleteAsset(pb.DeleteAssetRequest(asset_id=asset_id), metadata=SERVICE)
    assert reply.asset.status == 3  # ASSET_STATUS_DELETED


async def purged_at(media: MediaHarness, asset_id: str) -> object:
    async with media.engine.connect() as connection:
        found = await connection.execute(
            text("SELECT object_purged_at FROM media.assets WHERE asset_id = :a"),
            {"a": uuid.UUID(asset_id)},
        )
        return found.scalar_one()


async def test_local_urls_of_a_deleted_asset_stop_working(local_media: MediaHarness) -> None:
    urls = await ready_asset(local_media, ALICE, FIRST)
    await delete_asset(local_media, urls.asset_id)
    async with httpx.AsyncClient() as client:
        put = await client.put(urls.upload_url, content=SECOND, headers=urls.upload_headers)
        get = await client.get(urls.download_url)
    # The probe: the PUT was accepted and the old download URL then served SECOND.
    assert (put.status_code, *http_status(put)) == (404, 5, "ASSET_DELETED")
    assert (get.status_code, *http_status(get)) == (404, 5, "ASSET_DELETED")
    assert await local_media.storage.stat(urls.object_key) is None
    stored = await local_media.store.get(uuid.UUID(urls.asset_id))
    assert stored is not None and stored.status == Status.DELETED


async def test_local_upload_url_of_an_upload_deleted_before_any_bytes(
    local_media: MediaHarness,
) -> None:
    upload = await create_upload(local_media, ALICE, FIRST)
    await delete_asset(local_media, upload.asset.asset_id)
    async with httpx.AsyncClient() as client:
        put = await client.put(
            upload.upload_url, content=FIRST, headers=dict(upload.upload_headers)
        )
    assert (put.status_code, *http_status(put)) == (404, 5, "ASSET_DELETED")
    assert [p for p in local_media.settings.local_dir.rglob("*") if p.is_file()] == []


async def test_local_bytes_arriving_while_the_asset_is_deleted_do_not_stay(
    local_media: MediaHarness,
) -> None:
    # Larger than the listener reads whole (a small body is buffered, then written in one
    # step): these bytes stream to a .part file, the moment this test waits for. Both
    # paths end in the same recheck of the asset after the write.
    data = FIRST + bytes(READ_BYTES)
    upload = await create_upload(local_media, ALICE, data)
    incoming = local_media.settings.local_dir / INCOMING
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield data[:100]
        await release.wait()
        yield data[100:]

    async with httpx.AsyncClient() as client:
        headers = {**dict(upload.upload_headers), "Content-Length": str(len(data))}
        sending = asyncio.create_task(
            client.put(upload.upload_url, content=slow_body(), headers=headers)
        )
        # The listener accepted the request and is writing it (its .part file exists).
        await until(lambda: any(incoming.iterdir()))
        await delete_asset(local_media, upload.asset.asset_id)
        release.set()
        put = await sending
    assert (put.status_code, *http_status(put)) == (404, 5, "ASSET_DELETED")
    assert [p for p in local_media.settings.local_dir.rglob("*") if p.is_file()] == []


async def test_s3_an_object_put_after_deletion_is_removed_and_the_asset_settles(
    s3_media: MediaHarness,
) -> None:
    urls = await ready_asset(s3_media, ALICE, FIRST)
    await delete_asset(s3_media, urls.asset_id)
    assert await s3_media.storage.stat(urls.object_key) is None
    async with httpx.AsyncClient() as client:
        # What S3 cannot do: refuse a presigned PUT that has not expired yet.
        put = await client.put(urls.upload_url, content=SECOND, headers=urls.upload_headers)
        assert put.status_code == 200
        assert await s3_media.storage.stat(urls.object_key) is not None

        housekeeper = s3_media.housekeeper(batch_size=10)
        purge = await housekeeper.purge_deleted(s3_media.clock.now)
        assert purge.objects_removed == 1
        assert await s3_media.storage.stat(urls.object_key) is None
        # S3 answers a missing key 404, or 403 when the signer may not list the bucket
        # (moto says 403 too): either way, no bytes.
        gone = await client.get(urls.download_url)
        assert gone.status_code in (403, 404) and SECOND not in gone.content
        assert await purged_at(s3_media, urls.asset_id) is None  # still watched

        # Once no upload URL can add an object (expiry plus the write grace), it settles.
        s3_media.clock.advance(
            s3_media.settings.upload_url_ttl_seconds
            + DEFAULT_ABANDONED_WRITE_AGE / timedelta(seconds=1)
        )
        purge = await housekeeper.purge_deleted(s3_media.clock.now)
        assert purge.objects_removed == 0 and purge.settled >= 1
        assert await purged_at(s3_media, urls.asset_id) == s3_media.clock.now
        assert (await housekeeper.purge_deleted(s3_media.clock.now)).settled == 0
