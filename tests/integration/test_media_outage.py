"""media when a dependency does not answer: its database or its object store. Clients get
"retry later", never "bug": UNAVAILABLE with DATABASE_UNAVAILABLE or STORAGE_UNAVAILABLE
and RetryInfo over gRPC; 503 with a JSON status and Retry-After from the object listener."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.dev.processes import free_port
from services.kit.auth import issue_token
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.media.http import ObjectHttpServer
from services.media.storage.local import INCOMING, PART_SUFFIX, LocalStorage
from services.media.storage.s3 import S3Storage
from services.media.storage.signing import UrlSigner
from services.media.store.assets import AssetStore
from tests.support.media import (
    MediaHarness,
    create_upload,
    http_status,
    image_bytes,
    media_settings,
    running_media,
    until,
)
from tests.support.rpc import bearer, error_info, retry_delay
from tests.support.s3 import s3_settings

ALICE = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)
SERVICE = bearer(DEV_SERVICE_TOKEN)
JPEG = image_bytes("JPEG", 40, 30)
UNAVAILABLE = 14
KEY = "ai_input/2026/11/00000000-0000-4000-8000-000000000000"


def nothing_listens() -> str:
    """A PostgreSQL URL whose port refuses connections."""
    return f"postgresql://atelier@127.0.0.1:{free_port()}/atelier"


async def expect_unavailable(call: object, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    error = caught.value
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.UNAVAILABLE, reason)
    assert ("retry-after", "1") in tuple(error.initial_metadata() or ())


# -- the object listener -------------------------------------------------------------------


async def test_the_listener_answers_503_when_the_database_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    storage = LocalStorage(tmp_path / "objects", UrlSigner("u" * 40, base_url))
    engine = create_async_engine(asyncpg_url(nothing_listens()))
    server = ObjectHttpServer(storage, "127.0.0.1", port, rows=AssetStore(engine))
    serving = asyncio.create_task(server.serve_objects())
    soon = datetime.now(UTC) + timedelta(minutes=5)
    try:
        upload = await storage.presign_put(KEY, "image/jpeg", len(JPEG), soon)
        download = await storage.presign_get(KEY, "image/jpeg", soon)
        async with httpx.AsyncClient() as client:
            put = await client.put(upload.url, content=JPEG, headers=upload.headers)
            get = await client.get(download.url)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await engine.dispose()
    for response in (put, get):
        assert (response.status_code, *http_status(response)) == (
            503,
            UNAVAILABLE,
            "DATABASE_UNAVAILABLE",
        )
        assert response.headers["retry-after"] == "1"
    assert await storage.stat(KEY) is None
    # An outage is news, not a bug: one line per refusal, no stack trace.
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("services.media")] == [
        "object_request_refused"
    ] * 2


@pytest.fixture
async def local_media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path)) as harness:
        yield harness


async def test_the_listener_answers_503_when_the_disk_fails(local_media: MediaHarness) -> None:
    upload = await create_upload(local_media, ALICE, JPEG)
    headers = dict(upload.upload_headers)
    incoming = local_media.settings.local_dir / INCOMING
    # The directory writes go through is gone (a full or unmounted disk looks the same).
    shutil.rmtree(incoming)
    incoming.write_bytes(b"")
    async with httpx.AsyncClient() as client:
        refused = await client.put(upload.upload_url, content=JPEG, headers=headers)
        assert (refused.status_code, *http_status(refused)) == (
            503,
            UNAVAILABLE,
            "STORAGE_UNAVAILABLE",
        )
        assert refused.headers["retry-after"] == "1"
        # Retrying once the disk is back works: nothing was half done.
        incoming.unlink()
        incoming.mkdir()
        retried = await client.put(upload.upload_url, content=JPEG, headers=headers)
    assert retried.status_code == 200


# -- the gRPC services ---------------------------------------------------------------------


async def test_rpcs_say_database_unavailable_when_it_does_not_answer(tmp_path: Path) -> None:
    settings = media_settings(nothing_listens(), tmp_path)
    async with (
        running_media(settings) as media,
        media.public_channel() as public,
        media.internal_channel() as internal,
    ):
        health = health_pb2_grpc.HealthStub(public)
        checked = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert checked.status == health_pb2.HealthCheckResponse.NOT_SERVING

        stub = media_service_pb2_grpc.MediaServiceStub(public)
        reason = "DATABASE_UNAVAILABLE"
        await expect_unavailable(
            stub.CreateUpload(
                media_service_pb2.CreateUploadRequest(
                    purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                    content_type="image/jpeg",
                    size_bytes=len(JPEG),
                ),
                metadata=bearer(ALICE),
            ),
            reason,
        )
        asset_id = "00000000-0000-4000-8000-000000000000"
        await expect_unavailable(
            stub.GetAsset(
                media_service_pb2.GetAssetRequest(asset_id=asset_id), metadata=bearer(ALICE)
            ),
            reason,
        )
        inner = media_internal_service_pb2_grpc.MediaInternalServiceStub(internal)
        await expect_unavailable(
            inner.DeleteAsset(pb.DeleteAssetRequest(asset_id=asset_id), metadata=SERVICE),
            reason,
        )

        async def put_messages() -> AsyncIterator[pb.PutAssetRequest]:
            yield pb.PutAssetRequest(
                header=pb.PutAssetHeader(
                    owner_user_id="worker-output",
                    purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                    content_type="image/jpeg",
                )
            )
            yield pb.PutAssetRequest(chunk=JPEG)

        await expect_unavailable(inner.PutAsset(put_messages(), metadata=SERVICE), reason)
    # Nothing was stored for the asset that could not be recorded.
    assert [p for p in settings.local_dir.rglob("*") if p.is_file()] == []


async def test_a_lock_wait_past_lock_timeout_is_aborted_as_in_every_service(
    media_url: str, tmp_path: Path
) -> None:
    """Contention, not an outage: a delete that waits for a row another transaction
    holds answers ABORTED LOCK_TIMEOUT with RetryInfo (the kit's answer, creation's too),
    and the asset is left as it was."""
    settings = media_settings(media_url, tmp_path, DB_LOCK_TIMEOUT="0.2")
    async with running_media(settings) as media, media.internal_channel() as internal:
        upload = await create_upload(media, ALICE, JPEG)
        asset_id = upload.asset.asset_id
        inner = media_internal_service_pb2_grpc.MediaInternalServiceStub(internal)
        async with media.engine.connect() as holder, holder.begin():
            await holder.execute(
                text("SELECT 1 FROM media.assets WHERE asset_id = :id FOR UPDATE"),
                {"id": asset_id},
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await inner.DeleteAsset(pb.DeleteAssetRequest(asset_id=asset_id), metadata=SERVICE)
        error = caught.value
        assert (error.code(), error_info(error).reason) == (
            grpc.StatusCode.ABORTED,
            "LOCK_TIMEOUT",
        )
        assert retry_delay(error) == 1
        assert ("retry-after", "1") in tuple(error.initial_metadata() or ())
        # The lock is gone: the same call now goes through.
        deleted = await inner.DeleteAsset(
            pb.DeleteAssetRequest(asset_id=asset_id), metadata=SERVICE
        )
        assert deleted.asset.status == asset_pb2.ASSET_STATUS_DELETED


async def test_rpcs_say_storage_unavailable_when_s3_does_not_answer(
    media_url: str, tmp_path: Path
) -> None:
    unreachable = S3Storage(s3_settings(f"http://127.0.0.1:{free_port()}", "atelier"))
    async with running_media(media_settings(media_url, tmp_path), unreachable) as media:
        # Signing is local: the upload can be reserved; checking it needs S3.
        upload = await create_upload(media, ALICE, JPEG)
        async with media.public_channel() as channel:
            stub = media_service_pb2_grpc.MediaServiceStub(channel)
            await expect_unavailable(
                stub.CompleteUpload(
                    media_service_pb2.CompleteUploadRequest(asset_id=upload.asset.asset_id),
                    metadata=bearer(ALICE),
                ),
                "STORAGE_UNAVAILABLE",
            )


async def test_a_silent_s3_is_storage_unavailable_by_the_call_deadline(
    media_url: str, tmp_path: Path
) -> None:
    """An object store that takes the connection and never answers (botocore would wait
    its 60 s read timeout): the call answers by its deadline, naming the store."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        # Long enough for the upload's reservation on a loaded machine, short beside
        # botocore's 60 s.
        settings = media_settings(media_url, tmp_path, CALL_DEADLINE="2")
        async with running_media(settings, S3Storage(s3_settings(endpoint, "atelier"))) as media:
            upload = await create_upload(media, ALICE, JPEG)
            async with media.public_channel() as channel:
                stub = media_service_pb2_grpc.MediaServiceStub(channel)
                started = time.monotonic()
                await expect_unavailable(
                    stub.CompleteUpload(
                        media_service_pb2.CompleteUploadRequest(asset_id=upload.asset.asset_id),
                        metadata=bearer(ALICE),
                        timeout=30,
                    ),
                    "STORAGE_UNAVAILABLE",
                )
                assert time.monotonic() - started < 2 + 1.5


async def test_housekeeping_sweeps_part_files_while_the_database_is_down(
    tmp_path: Path,
) -> None:
    settings = media_settings(nothing_listens(), tmp_path, MEDIA_ABANDONED_WRITE_AGE="60")
    incoming = settings.local_dir / INCOMING
    incoming.mkdir(parents=True)
    stale = incoming / f"crashed{PART_SUFFIX}"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    async with running_media(settings):
        # The database passes fail first; the disk's own cleanup still runs.
        await until(lambda: not stale.exists())
