"""CreateUpload is idempotent by request_id (or the Idempotency-Key header), over a real
in-process MediaService, real PostgreSQL and media's local storage: a replay gets the same
asset and a working upload URL while the upload is open, a different request under the key
is refused, a completed or expired upload says so, and keys are per user."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from atelier.media.v1 import asset_pb2, media_service_pb2, media_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media
from tests.support.rpc import bad_request, bearer, error_info

ALICE = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)
BOB = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "bob", 3600)
JPEG = image_bytes("JPEG", 120, 90)
Stub = media_service_pb2_grpc.MediaServiceStub


@pytest.fixture(scope="module")
async def media(
    media_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path_factory.mktemp("m"))) as harness:
        yield harness


@pytest.fixture(scope="module")
async def stub(media: MediaHarness) -> AsyncIterator[Stub]:
    async with media.public_channel() as channel:
        yield media_service_pb2_grpc.MediaServiceStub(channel)


def request(
    request_id: str = "", data: bytes = JPEG, content_type: str = "image/jpeg"
) -> media_service_pb2.CreateUploadRequest:
    return media_service_pb2.CreateUploadRequest(
        purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
        content_type=content_type,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        request_id=request_id,
    )


async def refused(call: object) -> tuple[grpc.StatusCode, str, grpc.aio.AioRpcError]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), error_info(caught.value).reason, caught.value


async def test_a_replay_returns_the_same_upload_until_it_is_completed(stub: Stub) -> None:
    first, *replays = await asyncio.gather(
        *(stub.CreateUpload(request("photo-1"), metadata=bearer(ALICE)) for _ in range(4))
    )
    assert {r.asset.asset_id for r in replays} == {first.asset.asset_id}
    assert {r.expire_time.ToDatetime() for r in replays} == {first.expire_time.ToDatetime()}
    # The header is the same key; another user's key is another namespace.
    by_header = await stub.CreateUpload(
        request(), metadata=(*bearer(ALICE), ("idempotency-key", "photo-1"))
    )
    assert by_header.asset.asset_id == first.asset.asset_id
    bobs = await stub.CreateUpload(request("photo-1"), metadata=bearer(BOB))
    assert bobs.asset.asset_id != first.asset.asset_id

    # The replayed URL works: the bytes go up, the upload completes.
    latest = replays[-1]
    async with httpx.AsyncClient() as client:
        sent = await client.put(
            latest.upload_url, content=JPEG, headers=dict(latest.upload_headers)
        )
    assert sent.status_code == 200, sent.text
    await stub.CompleteUpload(
        media_service_pb2.CompleteUploadRequest(asset_id=first.asset.asset_id),
        metadata=bearer(ALICE),
    )
    code, reason, error = await refused(
        stub.CreateUpload(request("photo-1"), metadata=bearer(ALICE))
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UPLOAD_ALREADY_COMPLETED")
    assert error_info(error).metadata["asset_id"] == first.asset.asset_id


async def test_a_key_for_another_request_or_a_bad_key_is_refused(stub: Stub) -> None:
    await stub.CreateUpload(request("photo-2"), metadata=bearer(ALICE))
    other = image_bytes("PNG", 60, 40)
    code, reason, _ = await refused(
        stub.CreateUpload(request("photo-2", other, "image/png"), metadata=bearer(ALICE))
    )
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED")

    for call in (
        stub.CreateUpload(request("no spaces"), metadata=bearer(ALICE)),
        stub.CreateUpload(request("a"), metadata=(*bearer(ALICE), ("idempotency-key", "b"))),
    ):
        code, reason, error = await refused(call)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDEMPOTENCY_KEY")
        found = bad_request(error)
        assert found is not None
        assert [v.field for v in found.field_violations] == ["request_id"]


async def test_an_expired_upload_spends_its_key(stub: Stub, media: MediaHarness) -> None:
    await stub.CreateUpload(request("photo-3"), metadata=bearer(ALICE))
    media.clock.advance(media.settings.upload_url_ttl_seconds + 1)
    code, reason, _ = await refused(stub.CreateUpload(request("photo-3"), metadata=bearer(ALICE)))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UPLOAD_EXPIRED")
