"""MediaService over a real in-process grpc.aio server, real PostgreSQL and real storage
(media's own HTTP listener for the local backend, moto's S3 server for S3): the upload
round trip, and every bad input with its own reason."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client import REGISTRY

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.media.settings import S3Settings
from services.media.storage.s3 import S3Storage
from tests.support.media import (
    MediaHarness,
    image_bytes,
    media_settings,
    pixel_bomb_png,
    running_media,
)
from tests.support.rpc import bad_request, bearer, error_info

ALICE = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)
BOB = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "bob", 3600)
MAX_UPLOAD = 1024 * 1024
JPEG = image_bytes("JPEG", 120, 90)
INPUT = asset_pb2.ASSET_PURPOSE_AI_INPUT


@pytest.fixture
async def media(
    bucket: S3Settings | None, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    settings = media_settings(media_url, tmp_path, MAX_UPLOAD_BYTES=str(MAX_UPLOAD))
    storage = None if bucket is None else S3Storage(bucket)
    async with running_media(settings, storage) as harness:
        yield harness


@pytest.fixture
async def local_media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    settings = media_settings(media_url, tmp_path, MAX_UPLOAD_BYTES=str(MAX_UPLOAD))
    async with running_media(settings) as harness:
        yield harness


@pytest.fixture
async def stub(local_media: MediaHarness) -> AsyncIterator[media_service_pb2_grpc.MediaServiceStub]:
    async with local_media.public_channel() as channel:
        yield media_service_pb2_grpc.MediaServiceStub(channel)


async def create(
    stub: media_service_pb2_grpc.MediaServiceStub,
    data: bytes,
    content_type: str = "image/jpeg",
    token: str = ALICE,
    sha256: str = "",
) -> media_service_pb2.CreateUploadResponse:
    return await stub.CreateUpload(
        media_service_pb2.CreateUploadRequest(
            purpose=INPUT, content_type=content_type, size_bytes=len(data), sha256=sha256
        ),
        metadata=bearer(token),
    )


async def put(
    upload: media_service_pb2.CreateUploadResponse, data: bytes, **headers: str
) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.request(
            upload.upload_method,
            upload.upload_url,
            content=data,
            headers={**dict(upload.upload_headers), **headers},
        )


async def complete(
    stub: media_service_pb2_grpc.MediaServiceStub, asset_id: str, token: str = ALICE
) -> media_service_pb2.CompleteUploadResponse:
    return await stub.CompleteUpload(
        media_service_pb2.CompleteUploadRequest(asset_id=asset_id), metadata=bearer(token)
    )


async def failure(call: object) -> tuple[grpc.StatusCode, str, grpc.aio.AioRpcError]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), error_info(caught.value).reason, caught.value


async def uploaded(
    media: MediaHarness,
    stub: media_service_pb2_grpc.MediaServiceStub,
    data: bytes,
    content_type: str = "image/jpeg",
    sha256: str = "",
) -> media_service_pb2.CreateUploadResponse:
    upload = await create(stub, data, content_type, sha256=sha256)
    response = await put(upload, data)
    assert response.status_code == 200, response.text
    return upload


# -- the round trip, on both backends ----------------------------------------------------


def input_counters() -> tuple[float, float]:
    """Client uploads reserved, and inputs made ready from an upload, so far."""
    reserved = REGISTRY.get_sample_value(
        "atelier_media_uploads_reserved_total", {"purpose": "ai_input"}
    )
    ready = REGISTRY.get_sample_value(
        "atelier_media_assets_ready_total", {"purpose": "ai_input", "way": "upload"}
    )
    return reserved or 0.0, ready or 0.0


async def test_upload_complete_get_download(media: MediaHarness) -> None:
    counted = input_counters()
    async with media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        digest = hashlib.sha256(JPEG).hexdigest()
        upload = await create(stub, JPEG, sha256=digest.upper())
        assert upload.asset.status == asset_pb2.ASSET_STATUS_UPLOADING
        assert upload.asset.owner_user_id == "alice"
        assert upload.upload_method == "PUT"
        assert upload.expire_time.ToDatetime().timestamp() > media.clock.now.timestamp()
        # The key is made by media from the purpose, the month and the id: nothing of ours.
        assert f"ai_input/{media.clock.now:%Y/%m}/{upload.asset.asset_id}" in upload.upload_url

        assert (await put(upload, JPEG)).status_code == 200
        done = await complete(stub, upload.asset.asset_id)
        asset = done.asset
        assert asset.status == asset_pb2.ASSET_STATUS_READY
        assert (asset.width, asset.height) == (120, 90)
        assert asset.size_bytes == len(JPEG)
        assert asset.sha256 == digest
        assert asset.HasField("ready_time")
        # Counted; the lines saying so are DEBUG.
        assert input_counters() == (counted[0] + 1, counted[1] + 1)

        got = await stub.GetAsset(
            media_service_pb2.GetAssetRequest(asset_id=asset.asset_id), metadata=bearer(ALICE)
        )
        assert got.asset == asset
        assert got.download_url and got.HasField("download_url_expire_time")
        async with httpx.AsyncClient() as client:
            download = await client.get(got.download_url)
        assert download.status_code == 200
        assert download.content == JPEG
        assert download.headers["content-type"] == "image/jpeg"


async def test_a_failed_check_removes_the_object(media: MediaHarness) -> None:
    async with media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        upload = await create(stub, b"this is not an image at all", "image/png")
        assert (await put(upload, b"this is not an image at all")).status_code == 200
        code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_IMAGE")
        stored = await media.store.get(uuid.UUID(upload.asset.asset_id))
        assert stored is not None and stored.status == "uploading"
        assert await media.storage.stat(stored.object_key) is None


async def test_s3_upload_sent_with_another_content_type_is_refused(
    s3_bucket: S3Settings, media_url: str, tmp_path: Path
) -> None:
    settings = media_settings(media_url, tmp_path)
    async with (
        running_media(settings, S3Storage(s3_bucket)) as media,
        media.public_channel() as channel,
    ):
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        upload = await create(stub, JPEG)
        # A real S3 refuses the changed header (it is signed); moto stores it, so media's
        # own check is what stands here.
        assert (await put(upload, JPEG, **{"Content-Type": "text/html"})).status_code == 200
        code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CONTENT_TYPE_MISMATCH")
        stored = await media.store.get(uuid.UUID(upload.asset.asset_id))
        assert stored is not None and await media.storage.stat(stored.object_key) is None


# -- CreateUpload: every bad field its reason ----------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "reason", "field"),
    [
        ({"purpose": asset_pb2.ASSET_PURPOSE_AI_OUTPUT}, "UPLOAD_PURPOSE_NOT_ALLOWED", "purpose"),
        (
            {"purpose": asset_pb2.ASSET_PURPOSE_UNSPECIFIED},
            "UPLOAD_PURPOSE_NOT_ALLOWED",
            "purpose",
        ),
        ({"content_type": "image/gif"}, "CONTENT_TYPE_NOT_ALLOWED", "content_type"),
        ({"content_type": "text/html"}, "CONTENT_TYPE_NOT_ALLOWED", "content_type"),
        ({"content_type": ""}, "CONTENT_TYPE_NOT_ALLOWED", "content_type"),
        ({"size_bytes": 0}, "INVALID_SIZE", "size_bytes"),
        ({"size_bytes": -5}, "INVALID_SIZE", "size_bytes"),
        ({"size_bytes": MAX_UPLOAD + 1}, "UPLOAD_TOO_LARGE", "size_bytes"),
        ({"sha256": "abc"}, "INVALID_SHA256", "sha256"),
        ({"sha256": "g" * 64}, "INVALID_SHA256", "sha256"),
    ],
)
async def test_create_upload_refuses_bad_fields(
    stub: media_service_pb2_grpc.MediaServiceStub,
    request_fields: dict[str, object],
    reason: str,
    field: str,
) -> None:
    fields: dict[str, object] = {
        "purpose": INPUT,
        "content_type": "image/png",
        "size_bytes": 1000,
        **request_fields,
    }
    request = media_service_pb2.CreateUploadRequest(**fields)
    code, found, error = await failure(stub.CreateUpload(request, metadata=bearer(ALICE)))
    assert (code, found) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    violations = bad_request(error)
    assert violations is not None
    assert [v.field for v in violations.field_violations] == [field]


async def test_an_upload_over_the_limit_is_told_the_limit_in_mib(
    stub: media_service_pb2_grpc.MediaServiceStub,
) -> None:
    request = media_service_pb2.CreateUploadRequest(
        purpose=INPUT, content_type="image/png", size_bytes=MAX_UPLOAD + 1
    )
    _, _, error = await failure(stub.CreateUpload(request, metadata=bearer(ALICE)))
    violations = bad_request(error)
    assert violations is not None
    # MAX_UPLOAD is 1048576 bytes: said the way people read it.
    assert violations.field_violations[0].description == "must be at most 1 MiB"


async def test_the_largest_allowed_upload_is_accepted(
    stub: media_service_pb2_grpc.MediaServiceStub,
) -> None:
    reply = await stub.CreateUpload(
        media_service_pb2.CreateUploadRequest(
            purpose=INPUT, content_type="IMAGE/WEBP", size_bytes=MAX_UPLOAD
        ),
        metadata=bearer(ALICE),
    )
    assert reply.asset.content_type == "image/webp"
    assert reply.asset.size_bytes == MAX_UPLOAD


# -- CompleteUpload ------------------------------------------------------------------------


async def test_ids_must_be_uuids(stub: media_service_pb2_grpc.MediaServiceStub) -> None:
    for call in (
        complete(stub, "not-an-id"),
        stub.GetAsset(
            media_service_pb2.GetAssetRequest(asset_id="1; DROP"), metadata=bearer(ALICE)
        ),
    ):
        code, reason, error = await failure(call)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ASSET_ID")
        violations = bad_request(error)
        assert violations is not None and violations.field_violations[0].field == "asset_id"


async def test_another_users_asset_is_not_found_like_an_unknown_one(
    local_media: MediaHarness, stub: media_service_pb2_grpc.MediaServiceStub
) -> None:
    upload = await uploaded(local_media, stub, JPEG)
    asset_id = upload.asset.asset_id
    unknown = "00000000-0000-4000-8000-000000000000"
    answers = []
    for call in (
        complete(stub, asset_id, token=BOB),
        stub.GetAsset(media_service_pb2.GetAssetRequest(asset_id=asset_id), metadata=bearer(BOB)),
        complete(stub, unknown),
        stub.GetAsset(media_service_pb2.GetAssetRequest(asset_id=unknown), metadata=bearer(ALICE)),
    ):
        code, reason, error = await failure(call)
        answers.append((code, reason, error.details()))
    assert answers == [(grpc.StatusCode.NOT_FOUND, "ASSET_NOT_FOUND", "no such asset")] * 4
    # Bob's attempt changed nothing: Alice completes her upload.
    assert (await complete(stub, asset_id)).asset.status == asset_pb2.ASSET_STATUS_READY


async def test_completing_before_the_bytes_arrive_can_be_retried(
    stub: media_service_pb2_grpc.MediaServiceStub,
) -> None:
    upload = await create(stub, JPEG)
    code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_MISSING")
    assert (await put(upload, JPEG)).status_code == 200
    assert (await complete(stub, upload.asset.asset_id)).asset.width == 120


@pytest.mark.parametrize(
    ("declared", "sent", "content_type", "sha256", "reason"),
    [
        (JPEG + b"tail", JPEG, "image/jpeg", "", "SIZE_MISMATCH"),
        (JPEG, JPEG, "image/jpeg", "0" * 64, "HASH_MISMATCH"),
        (b"plain text, no image" * 3, b"plain text, no image" * 3, "image/png", "", "NOT_AN_IMAGE"),
        (JPEG[:400], JPEG[:400], "image/jpeg", "", "NOT_AN_IMAGE"),
        (image_bytes("PNG"), image_bytes("PNG"), "image/jpeg", "", "CONTENT_TYPE_MISMATCH"),
        (image_bytes("WEBP"), image_bytes("WEBP"), "image/png", "", "CONTENT_TYPE_MISMATCH"),
        (
            pixel_bomb_png(20_000, 20_000),
            pixel_bomb_png(20_000, 20_000),
            "image/png",
            "",
            "IMAGE_TOO_LARGE",
        ),
    ],
    ids=["short", "hash", "text", "truncated", "png-as-jpeg", "webp-as-png", "pixel-bomb"],
)
async def test_complete_refuses_bad_bytes_and_deletes_them(
    local_media: MediaHarness,
    stub: media_service_pb2_grpc.MediaServiceStub,
    declared: bytes,
    sent: bytes,
    content_type: str,
    sha256: str,
    reason: str,
) -> None:
    upload = await create(stub, declared, content_type, sha256=sha256)
    assert (await put(upload, sent)).status_code == 200
    code, found, _ = await failure(complete(stub, upload.asset.asset_id))
    assert (code, found) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    stored = await local_media.store.get(uuid.UUID(upload.asset.asset_id))
    assert stored is not None and stored.status == "uploading" and stored.ready_at is None
    assert await local_media.storage.stat(stored.object_key) is None


async def test_after_a_rejection_the_client_can_upload_again(
    local_media: MediaHarness, stub: media_service_pb2_grpc.MediaServiceStub
) -> None:
    upload = await create(stub, JPEG)
    assert (await put(upload, b"x" * len(JPEG))).status_code == 200
    code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_IMAGE")
    # The bad bytes are gone, so the same signed URL takes the right ones.
    assert (await put(upload, JPEG)).status_code == 200
    done = await complete(stub, upload.asset.asset_id)
    assert done.asset.status == asset_pb2.ASSET_STATUS_READY
    stored = await local_media.store.get(uuid.UUID(upload.asset.asset_id))
    assert stored is not None and stored.rejected_uploads == 1


async def test_completing_twice(
    stub: media_service_pb2_grpc.MediaServiceStub, local_media: MediaHarness
) -> None:
    upload = await uploaded(local_media, stub, JPEG)
    first = await complete(stub, upload.asset.asset_id)
    code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UPLOAD_ALREADY_COMPLETED")
    again = await stub.GetAsset(
        media_service_pb2.GetAssetRequest(asset_id=upload.asset.asset_id), metadata=bearer(ALICE)
    )
    assert again.asset == first.asset


async def test_concurrent_completes_make_one_ready_asset(
    local_media: MediaHarness, stub: media_service_pb2_grpc.MediaServiceStub
) -> None:
    for _ in range(5):
        upload = await uploaded(local_media, stub, JPEG)
        outcomes = await asyncio.gather(
            *(complete(stub, upload.asset.asset_id) for _ in range(3)), return_exceptions=True
        )
        ready = [o for o in outcomes if isinstance(o, media_service_pb2.CompleteUploadResponse)]
        refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
        assert len(ready) == 1 and len(refused) == 2
        assert {error_info(e).reason for e in refused} == {"UPLOAD_ALREADY_COMPLETED"}
        stored = await local_media.store.get(uuid.UUID(upload.asset.asset_id))
        assert stored is not None and stored.status == "ready"
        assert stored.ready_at == ready[0].asset.ready_time.ToDatetime().replace(
            tzinfo=stored.ready_at.tzinfo
        )


async def test_an_expired_upload_cannot_be_completed(
    local_media: MediaHarness, stub: media_service_pb2_grpc.MediaServiceStub
) -> None:
    upload = await uploaded(local_media, stub, JPEG)
    local_media.clock.advance(local_media.settings.upload_url_ttl_seconds + 1)
    code, reason, _ = await failure(complete(stub, upload.asset.asset_id))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "UPLOAD_EXPIRED")


async def test_get_asset_while_uploading_has_no_download_url(
    stub: media_service_pb2_grpc.MediaServiceStub,
) -> None:
    upload = await create(stub, JPEG)
    got = await stub.GetAsset(
        media_service_pb2.GetAssetRequest(asset_id=upload.asset.asset_id), metadata=bearer(ALICE)
    )
    assert got.asset.status == asset_pb2.ASSET_STATUS_UPLOADING
    assert got.asset.size_bytes == len(JPEG)  # the declared size, until measured
    assert got.download_url == "" and not got.HasField("download_url_expire_time")


async def test_public_calls_need_a_user_token(
    stub: media_service_pb2_grpc.MediaServiceStub,
) -> None:
    code, reason, _ = await failure(
        stub.GetAsset(
            media_service_pb2.GetAssetRequest(asset_id="00000000-0000-4000-8000-000000000000")
        )
    )
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")


async def test_only_client_uploads_can_be_completed(
    local_media: MediaHarness, stub: media_service_pb2_grpc.MediaServiceStub
) -> None:
    async def one_output() -> AsyncIterator[pb.PutAssetRequest]:
        yield pb.PutAssetRequest(
            header=pb.PutAssetHeader(
                owner_user_id="alice",
                purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                content_type="image/png",
            )
        )
        yield pb.PutAssetRequest(chunk=image_bytes("PNG"))

    async with local_media.internal_channel() as channel:
        output = await media_internal_service_pb2_grpc.MediaInternalServiceStub(channel).PutAsset(
            one_output(), metadata=bearer(DEV_SERVICE_TOKEN)
        )
    code, reason, _ = await failure(complete(stub, output.asset.asset_id))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "ASSET_NOT_FOUND")
    # Yet it is Alice's, and she can read it.
    got = await stub.GetAsset(
        media_service_pb2.GetAssetRequest(asset_id=output.asset.asset_id), metadata=bearer(ALICE)
    )
    assert got.asset.purpose == asset_pb2.ASSET_PURPOSE_AI_OUTPUT and got.download_url
