"""MediaInternalService over a real in-process grpc.aio server with the service credential:
PutAsset stores, measures and registers a ready asset in one streamed call; ReadAsset
streams it back; GetAssetUrl, GetAssetInfo and DeleteAsset; and PutAsset's bad inputs
leave nothing behind."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from prometheus_client import REGISTRY
from sqlalchemy import text

from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.media.domain import Asset, Purpose, Status, object_key
from services.media.settings import S3Settings
from services.media.storage.s3 import S3Storage
from tests.support.media import (
    MediaHarness,
    http_status,
    image_bytes,
    media_settings,
    noisy_png,
    pixel_bomb_png,
    running_media,
)
from tests.support.rpc import bearer, error_info

CHUNK = 64 * 1024
MAX_UPLOAD = 2 * 1024 * 1024
SERVICE = bearer(DEV_SERVICE_TOKEN)
OUTPUT = asset_pb2.ASSET_PURPOSE_AI_OUTPUT
Stub = media_internal_service_pb2_grpc.MediaInternalServiceStub


@pytest.fixture
async def media(
    bucket: S3Settings | None, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    settings = media_settings(
        media_url, tmp_path, MEDIA_CHUNK_BYTES=str(CHUNK), MAX_UPLOAD_BYTES=str(MAX_UPLOAD)
    )
    async with running_media(settings, None if bucket is None else S3Storage(bucket)) as harness:
        yield harness


@pytest.fixture
async def local_media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    settings = media_settings(
        media_url, tmp_path, MEDIA_CHUNK_BYTES=str(CHUNK), MAX_UPLOAD_BYTES=str(MAX_UPLOAD)
    )
    async with running_media(settings) as harness:
        yield harness


@pytest.fixture
async def stub(local_media: MediaHarness) -> AsyncIterator[Stub]:
    async with local_media.internal_channel() as channel:
        yield Stub(channel)


def header(
    owner: str = "alice",
    purpose: int = OUTPUT,
    content_type: str = "image/png",
    idempotency_key: str = "",
) -> pb.PutAssetRequest:
    return pb.PutAssetRequest(
        header=pb.PutAssetHeader(
            owner_user_id=owner,
            purpose=purpose,
            content_type=content_type,
            idempotency_key=idempotency_key,
        )
    )


async def stream(
    *messages: pb.PutAssetRequest, data: bytes = b""
) -> AsyncIterator[pb.PutAssetRequest]:
    for message in messages:
        yield message
    for start in range(0, len(data), CHUNK):
        yield pb.PutAssetRequest(chunk=data[start : start + CHUNK])


async def put_asset(stub: Stub, data: bytes, **fields: object) -> asset_pb2.Asset:
    reply = await stub.PutAsset(stream(header(**fields), data=data), metadata=SERVICE)
    return reply.asset


async def read_asset(stub: Stub, asset_id: str) -> tuple[asset_pb2.Asset, list[bytes]]:
    call = stub.ReadAsset(pb.ReadAssetRequest(asset_id=asset_id), metadata=SERVICE)
    messages = [message async for message in call]
    assert messages[0].WhichOneof("part") == "asset"
    assert all(m.WhichOneof("part") == "chunk" for m in messages[1:])
    return messages[0].asset, [m.chunk for m in messages[1:]]


async def failure(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), error_info(caught.value).reason


# -- PutAsset and ReadAsset, on both backends ------------------------------------------------


async def test_put_asset_then_read_it_back(media: MediaHarness) -> None:
    png = noisy_png(300, 200)
    assert len(png) > 2 * CHUNK
    async with media.internal_channel() as channel:
        stub = Stub(channel)
        asset = await put_asset(stub, png, owner="user-7")
        assert asset.status == asset_pb2.ASSET_STATUS_READY
        assert asset.owner_user_id == "user-7"
        assert asset.purpose == OUTPUT
        assert (asset.width, asset.height) == (300, 200)
        assert asset.size_bytes == len(png)
        assert asset.sha256 == hashlib.sha256(png).hexdigest()
        assert asset.content_type == "image/png"

        head, chunks = await read_asset(stub, asset.asset_id)
        assert head == asset
        assert b"".join(chunks) == png
        assert all(len(chunk) <= CHUNK for chunk in chunks) and len(chunks) >= 3

        url = await stub.GetAssetUrl(
            pb.GetAssetUrlRequest(asset_id=asset.asset_id), metadata=SERVICE
        )
        assert url.asset == asset
        async with httpx.AsyncClient() as client:
            download = await client.get(url.download_url)
        assert download.content == png and download.headers["content-type"] == "image/png"


async def test_put_asset_accepts_inputs_too(stub: Stub) -> None:
    asset = await put_asset(
        stub,
        image_bytes("WEBP", 10, 20),
        purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
        content_type="image/webp",
    )
    assert asset.purpose == asset_pb2.ASSET_PURPOSE_AI_INPUT and (asset.width, asset.height) == (
        10,
        20,
    )


async def owned_rows(media: MediaHarness, owner: str) -> int:
    async with media.engine.connect() as connection:
        found = await connection.execute(
            text("SELECT count(*) FROM media.assets WHERE owner_user_id = :o"), {"o": owner}
        )
        return int(found.scalar_one())


PNG = image_bytes("PNG", 40, 30)


@pytest.mark.parametrize(
    ("messages", "data", "code", "reason"),
    [
        ((), b"", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PUT_STREAM"),
        (
            (pb.PutAssetRequest(chunk=PNG),),
            b"",
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PUT_STREAM",
        ),
        (
            (header(owner="{o}"), header(owner="{o}")),
            PNG,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PUT_STREAM",
        ),
        ((header(owner=""),), PNG, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_OWNER"),
        ((header(owner="a\nb"),), PNG, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_OWNER"),
        (
            (header(owner="{o}", purpose=asset_pb2.ASSET_PURPOSE_UNSPECIFIED),),
            PNG,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PURPOSE",
        ),
        (
            (header(owner="{o}", content_type="image/gif"),),
            PNG,
            grpc.StatusCode.INVALID_ARGUMENT,
            "CONTENT_TYPE_NOT_ALLOWED",
        ),
        ((header(owner="{o}"),), b"", grpc.StatusCode.INVALID_ARGUMENT, "NOT_AN_IMAGE"),
        (
            (header(owner="{o}"),),
            b"%PDF-1.7 not an image" * 100,
            grpc.StatusCode.INVALID_ARGUMENT,
            "NOT_AN_IMAGE",
        ),
        (
            (header(owner="{o}", content_type="image/jpeg"),),
            PNG,
            grpc.StatusCode.INVALID_ARGUMENT,
            "CONTENT_TYPE_MISMATCH",
        ),
        (
            (header(owner="{o}"),),
            pixel_bomb_png(20_000, 20_000),
            grpc.StatusCode.INVALID_ARGUMENT,
            "IMAGE_TOO_LARGE",
        ),
        (
            (header(owner="{o}"),),
            b"\0" * (MAX_UPLOAD + 1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "UPLOAD_TOO_LARGE",
        ),
    ],
    ids=[
        "empty-stream",
        "no-header",
        "two-headers",
        "no-owner",
        "control-char-owner",
        "no-purpose",
        "gif",
        "no-bytes",
        "pdf",
        "png-as-jpeg",
        "pixel-bomb",
        "too-large",
    ],
)
async def test_put_asset_refuses_bad_input_and_keeps_nothing(
    local_media: MediaHarness,
    stub: Stub,
    messages: tuple[pb.PutAssetRequest, ...],
    data: bytes,
    code: grpc.StatusCode,
    reason: str,
) -> None:
    owner = f"owner-{uuid.uuid4()}"
    for message in messages:
        if message.WhichOneof("part") == "header" and message.header.owner_user_id == "{o}":
            message.header.owner_user_id = owner
    call = stub.PutAsset(stream(*messages, data=data), metadata=SERVICE)
    assert await failure(call) == (code, reason)
    assert await owned_rows(local_media, owner) == 0
    assert [p for p in local_media.settings.local_dir.rglob("*") if p.is_file()] == []


# -- reading, URLs, info, deleting ---------------------------------------------------------


UNKNOWN = "00000000-0000-4000-8000-000000000000"


async def test_unknown_and_malformed_ids(stub: Stub) -> None:
    for asset_id, expected in (
        (UNKNOWN, (grpc.StatusCode.NOT_FOUND, "ASSET_NOT_FOUND")),
        ("nope", (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ASSET_ID")),
    ):
        calls = [
            stub.GetAssetInfo(pb.GetAssetInfoRequest(asset_id=asset_id), metadata=SERVICE),
            stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=asset_id), metadata=SERVICE),
            stub.DeleteAsset(pb.DeleteAssetRequest(asset_id=asset_id), metadata=SERVICE),
            read_asset(stub, asset_id),
        ]
        for call in calls:
            assert await failure(call) == expected


async def test_an_upload_is_not_ready_for_reading(local_media: MediaHarness, stub: Stub) -> None:
    asset = await local_media.store.get(uuid.UUID((await _reserve(local_media)).asset_id))
    assert asset is not None and asset.purpose == Purpose.AI_INPUT
    info = await stub.GetAssetInfo(
        pb.GetAssetInfoRequest(asset_id=str(asset.asset_id)), metadata=SERVICE
    )
    assert info.asset.status == asset_pb2.ASSET_STATUS_UPLOADING
    for call in (
        stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=str(asset.asset_id)), metadata=SERVICE),
        read_asset(stub, str(asset.asset_id)),
    ):
        assert await failure(call) == (grpc.StatusCode.FAILED_PRECONDITION, "ASSET_NOT_READY")


async def _reserve(media: MediaHarness) -> asset_pb2.Asset:
    """An asset still uploading, reserved by a user through the public service."""
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600)
    async with media.public_channel() as channel:
        reply = await media_service_pb2_grpc.MediaServiceStub(channel).CreateUpload(
            media_service_pb2.CreateUploadRequest(
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT, content_type="image/png", size_bytes=10
            ),
            metadata=bearer(token),
        )
    return reply.asset


async def test_delete_is_idempotent_and_removes_the_object(
    local_media: MediaHarness, stub: Stub
) -> None:
    asset = await put_asset(stub, PNG)
    url = await stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=asset.asset_id), metadata=SERVICE)
    stored = await local_media.store.get(uuid.UUID(asset.asset_id))
    assert stored is not None

    deleted = await stub.DeleteAsset(
        pb.DeleteAssetRequest(asset_id=asset.asset_id), metadata=SERVICE
    )
    again = await stub.DeleteAsset(pb.DeleteAssetRequest(asset_id=asset.asset_id), metadata=SERVICE)
    assert deleted.asset.status == again.asset.status == asset_pb2.ASSET_STATUS_DELETED
    assert deleted.asset == again.asset
    assert await local_media.storage.stat(stored.object_key) is None
    async with httpx.AsyncClient() as client:
        assert (await client.get(url.download_url)).status_code == 404

    info = await stub.GetAssetInfo(
        pb.GetAssetInfoRequest(asset_id=asset.asset_id), metadata=SERVICE
    )
    assert info.asset.status == asset_pb2.ASSET_STATUS_DELETED
    assert info.asset.sha256 == asset.sha256  # what it was stays on record
    for call in (
        stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=asset.asset_id), metadata=SERVICE),
        read_asset(stub, asset.asset_id),
    ):
        assert await failure(call) == (grpc.StatusCode.FAILED_PRECONDITION, "ASSET_DELETED")


async def test_a_ready_asset_whose_object_vanished_is_data_loss(
    local_media: MediaHarness, stub: Stub
) -> None:
    asset = await put_asset(stub, PNG)
    stored = await local_media.store.get(uuid.UUID(asset.asset_id))
    assert stored is not None
    await local_media.storage.delete(stored.object_key)
    call = stub.ReadAsset(pb.ReadAssetRequest(asset_id=asset.asset_id), metadata=SERVICE)
    first = await call.read()
    assert first.asset == asset
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    assert error_info(caught.value).reason == "OBJECT_LOST"


async def test_internal_calls_need_the_service_credential(stub: Stub) -> None:
    user = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600)
    request = pb.GetAssetInfoRequest(asset_id=UNKNOWN)
    assert await failure(stub.GetAssetInfo(request, metadata=bearer(user))) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "SERVICE_CREDENTIAL_INVALID",
    )
    assert await failure(stub.GetAssetInfo(request)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "SERVICE_CREDENTIAL_MISSING",
    )


# -- PutAsset's idempotency key and DeleteKeyedAssets ---------------------------------------


async def test_a_keyed_put_repeated_with_the_same_bytes_returns_the_same_asset(
    local_media: MediaHarness, stub: Stub
) -> None:
    owner = f"owner-{uuid.uuid4()}"
    first = await put_asset(stub, PNG, owner=owner, idempotency_key="creation:job:1:0")
    again = await put_asset(stub, PNG, owner=owner, idempotency_key="creation:job:1:0")
    assert first == again and first.status == asset_pb2.ASSET_STATUS_READY
    other = await put_asset(stub, PNG, owner=owner, idempotency_key="creation:job:1:1")
    unkeyed = await put_asset(stub, PNG, owner=owner)
    assert len({first.asset_id, other.asset_id, unkeyed.asset_id}) == 3
    # The key is the owner's: another owner's equal key is another asset.
    elsewhere = await put_asset(stub, PNG, owner=f"{owner}-b", idempotency_key="creation:job:1:0")
    assert elsewhere.asset_id != first.asset_id
    assert await owned_rows(local_media, owner) == 3


async def test_a_keyed_put_with_other_content_is_refused_with_a_stable_reason(
    local_media: MediaHarness, stub: Stub
) -> None:
    owner = f"owner-{uuid.uuid4()}"
    first = await put_asset(stub, PNG, owner=owner, idempotency_key="k1")
    for data, fields in (
        (image_bytes("PNG", 41, 30), {}),
        (PNG, {"purpose": asset_pb2.ASSET_PURPOSE_AI_INPUT}),
    ):
        call = put_asset(stub, data, owner=owner, idempotency_key="k1", **fields)
        assert await failure(call) == (grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED")
    assert await owned_rows(local_media, owner) == 1
    _, chunks = await read_asset(stub, first.asset_id)
    assert b"".join(chunks) == PNG


@pytest.mark.parametrize("object_stored", [False, True], ids=["before-storing", "after-storing"])
async def test_a_keyed_put_that_died_half_way_is_finished_by_its_repeat(
    local_media: MediaHarness, stub: Stub, object_stored: bool
) -> None:
    """A put killed after claiming its key (the row uploading, its object stored or not)
    leaves nothing a repeat cannot finish: the repeat lands onto the same asset."""
    owner = f"owner-{uuid.uuid4()}"
    now = local_media.clock()
    asset_id = uuid.uuid4()
    claimed = await local_media.store.insert_keyed(
        Asset(
            asset_id=asset_id,
            owner_user_id=owner,
            purpose=Purpose.AI_OUTPUT,
            status=Status.UPLOADING,
            content_type="image/png",
            declared_size_bytes=None,
            declared_sha256=hashlib.sha256(PNG).hexdigest(),
            size_bytes=None,
            sha256=None,
            width=None,
            height=None,
            rejected_uploads=0,
            object_key=object_key(Purpose.AI_OUTPUT, asset_id, now),
            created_at=now,
            upload_expires_at=now + timedelta(minutes=15),
            ready_at=None,
            deleted_at=None,
            idempotency_key="k2",
        )
    )
    assert claimed.asset_id == asset_id and claimed.status == Status.UPLOADING
    if object_stored:
        await local_media.storage.put(claimed.object_key, _once(PNG), "image/png")
    repeated = await put_asset(stub, PNG, owner=owner, idempotency_key="k2")
    assert repeated.asset_id == str(asset_id)
    assert repeated.status == asset_pb2.ASSET_STATUS_READY
    _, chunks = await read_asset(stub, repeated.asset_id)
    assert b"".join(chunks) == PNG
    assert await owned_rows(local_media, owner) == 1


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_delete_keyed_assets_removes_them_and_their_keys_stay_dead(
    local_media: MediaHarness, stub: Stub
) -> None:
    owner = f"owner-{uuid.uuid4()}"
    kept = await put_asset(stub, PNG, owner=owner, idempotency_key="keep")
    gone = await put_asset(stub, PNG, owner=owner, idempotency_key="gone")
    request = pb.DeleteKeyedAssetsRequest(
        owner_user_id=owner, idempotency_keys=["gone", "never-used"]
    )
    reply = await stub.DeleteKeyedAssets(request, metadata=SERVICE)
    assert [a.asset_id for a in reply.assets] == [gone.asset_id]
    assert reply.assets[0].status == asset_pb2.ASSET_STATUS_DELETED
    assert list((await stub.DeleteKeyedAssets(request, metadata=SERVICE)).assets) == []
    stored = await local_media.store.get(uuid.UUID(gone.asset_id))
    assert stored is not None and await local_media.storage.stat(stored.object_key) is None
    info = await stub.GetAssetInfo(pb.GetAssetInfoRequest(asset_id=kept.asset_id), metadata=SERVICE)
    assert info.asset.status == asset_pb2.ASSET_STATUS_READY
    # A late repeat of a deleted put brings nothing back.
    late = put_asset(stub, PNG, owner=owner, idempotency_key="gone")
    assert await failure(late) == (grpc.StatusCode.FAILED_PRECONDITION, "ASSET_DELETED")
    assert await owned_rows(local_media, owner) == 2


@pytest.mark.parametrize(
    ("keys", "bad_key"),
    [([], ""), (["ok", "bad key"], ""), (["k"] * 101, ""), (["ok"], "has space")],
    ids=["no-keys", "bad-key", "too-many", "bad-put-key"],
)
async def test_bad_idempotency_keys_are_refused(stub: Stub, keys: list[str], bad_key: str) -> None:
    if bad_key:
        call: object = put_asset(stub, PNG, idempotency_key=bad_key)
        expected = "INVALID_IDEMPOTENCY_KEY"
    else:
        call = stub.DeleteKeyedAssets(
            pb.DeleteKeyedAssetsRequest(owner_user_id="alice", idempotency_keys=keys),
            metadata=SERVICE,
        )
        expected = "INVALID_IDEMPOTENCY_KEYS"
    assert await failure(call) == (grpc.StatusCode.INVALID_ARGUMENT, expected)


# -- output uploads: reserved by the server, PUT by a remote worker ------------------------

OUTPUT_KEY = "creation:job:j1:attempt:1:output:0"


async def reserve_output(
    stub: Stub, owner: str, data: bytes, sha256: str = "", key: str = OUTPUT_KEY
) -> pb.ReserveOutputUploadResponse:
    return await stub.ReserveOutputUpload(
        pb.ReserveOutputUploadRequest(
            owner_user_id=owner,
            content_type="image/png",
            size_bytes=len(data),
            sha256=sha256 or hashlib.sha256(data).hexdigest(),
            idempotency_key=key,
        ),
        metadata=SERVICE,
    )


def complete_output(stub: Stub, owner: str, asset_id: str, key: str = OUTPUT_KEY) -> object:
    return stub.CompleteOutputUpload(
        pb.CompleteOutputUploadRequest(asset_id=asset_id, owner_user_id=owner, idempotency_key=key),
        metadata=SERVICE,
    )


async def put_upload(reserved: pb.ReserveOutputUploadResponse, data: bytes) -> None:
    async with httpx.AsyncClient() as client:
        sent = await client.request(
            reserved.upload_method,
            reserved.upload_url,
            content=data,
            headers=dict(reserved.upload_headers),
        )
    assert sent.status_code == 200, sent.text


def counters() -> tuple[float, float]:
    """Output uploads reserved, and outputs made ready from an upload, so far."""
    reserved = REGISTRY.get_sample_value(
        "atelier_media_uploads_reserved_total", {"purpose": "ai_output"}
    )
    ready = REGISTRY.get_sample_value(
        "atelier_media_assets_ready_total", {"purpose": "ai_output", "way": "upload"}
    )
    return reserved or 0.0, ready or 0.0


async def test_an_output_upload_is_reserved_put_and_completed_and_its_thumbnail_follows(
    media: MediaHarness,
) -> None:
    png, owner = noisy_png(300, 200), str(uuid.uuid4())
    counted = counters()
    async with media.internal_channel() as channel:
        stub = Stub(channel)
        reserved = await reserve_output(stub, owner, png)
        asset_id = reserved.asset.asset_id
        assert reserved.asset.status == asset_pb2.ASSET_STATUS_UPLOADING
        assert reserved.asset.purpose == OUTPUT and reserved.upload_method == "PUT"
        # A replay answers the same asset; the key with other bytes is refused.
        assert (await reserve_output(stub, owner, png)).asset.asset_id == asset_id
        assert await failure(reserve_output(stub, owner, png, sha256="0" * 64)) == (
            grpc.StatusCode.ALREADY_EXISTS,
            "IDEMPOTENCY_KEY_REUSED",
        )
        assert await failure(complete_output(stub, owner, asset_id)) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "OBJECT_MISSING",
        )
        await put_upload(reserved, png)
        # Only its owner and key name it.
        for who, key in (("user-8", OUTPUT_KEY), (owner, "creation:job:j1:attempt:1:output:1")):
            assert await failure(complete_output(stub, who, asset_id, key)) == (
                grpc.StatusCode.NOT_FOUND,
                "ASSET_NOT_FOUND",
            )
        ready = (await complete_output(stub, owner, asset_id)).asset  # type: ignore[attr-defined]
        assert ready.status == asset_pb2.ASSET_STATUS_READY
        assert (ready.width, ready.height, ready.sha256) == (
            300,
            200,
            hashlib.sha256(png).hexdigest(),
        )
        # Completing again (a caller that crashed half-way) answers the same asset.
        again = (await complete_output(stub, owner, asset_id)).asset  # type: ignore[attr-defined]
        assert again == ready
        replayed = await reserve_output(stub, owner, png)
        assert replayed.asset.status == asset_pb2.ASSET_STATUS_READY and not replayed.upload_url
        # Counted (their lines are DEBUG): two reservations signed a PUT, one asset made
        # ready; neither the answers for the ready asset nor the refusals count.
        assert counters() == (counted[0] + 2, counted[1] + 1)
        urls = await stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=asset_id), metadata=SERVICE)
        # Committed without a preview: until the thumbnail maker (off in this harness,
        # one round below) has made it, the answer has the picture's URL only.
        assert urls.download_url and not urls.thumbnail_url
        await media.make_thumbnails()
        urls = await stub.GetAssetUrl(pb.GetAssetUrlRequest(asset_id=asset_id), metadata=SERVICE)
        assert urls.thumbnail_url
        async with httpx.AsyncClient() as client:
            thumbnail = await client.get(urls.thumbnail_url)
        assert thumbnail.status_code == 200 and thumbnail.content[:4] == b"RIFF"


@pytest.mark.parametrize(
    ("declared", "sent", "reason"),
    [
        ("sha of other bytes", noisy_png(40, 30), "HASH_MISMATCH"),
        ("the same bytes", b"not an image at all", "NOT_AN_IMAGE"),
    ],
)
async def test_an_output_upload_that_is_not_what_was_declared_is_refused(
    stub: Stub, declared: str, sent: bytes, reason: str
) -> None:
    owner = str(uuid.uuid4())
    sha = hashlib.sha256(sent if declared == "the same bytes" else b"other").hexdigest()
    reserved = await reserve_output(stub, owner, sent, sha256=sha)
    if reason == "HASH_MISMATCH":
        # The URL is signed with the declared hash: media's listener refuses other bytes
        # before they appear under the key, so the commit finds no object at all.
        async with httpx.AsyncClient() as client:
            answer = await client.put(
                reserved.upload_url, content=sent, headers=dict(reserved.upload_headers)
            )
        assert answer.status_code == 400 and http_status(answer)[1] == reason
        expected = (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_MISSING")
    else:
        await put_upload(reserved, sent)
        expected = (grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert await failure(complete_output(stub, owner, reserved.asset.asset_id)) == expected
    info = await stub.GetAssetInfo(
        pb.GetAssetInfoRequest(asset_id=reserved.asset.asset_id), metadata=SERVICE
    )
    assert info.asset.status == asset_pb2.ASSET_STATUS_UPLOADING


# -- the batched reservations and commits: each item answered on its own ---------------


def item_failure(status: object) -> tuple[int, str, list[str]]:
    """An item's google.rpc.Status: its code, ErrorInfo reason and violated fields."""
    assert isinstance(status, status_pb2.Status)
    reason, fields = "", []
    for detail in status.details:
        info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
        if detail.Unpack(info):
            reason = info.reason
        elif detail.Unpack(bad):
            fields = [violation.field for violation in bad.field_violations]
    return status.code, reason, fields


def declaration(
    owner: str, data: bytes, key: str, **changes: object
) -> pb.ReserveOutputUploadRequest:
    request = pb.ReserveOutputUploadRequest(
        owner_user_id=owner,
        content_type="image/png",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        idempotency_key=key,
    )
    for name, value in changes.items():
        setattr(request, name, value)
    return request


async def test_batched_reservations_and_commits_answer_each_item_on_its_own(
    media: MediaHarness,
) -> None:
    owner, first, second = str(uuid.uuid4()), noisy_png(64, 48), noisy_png(32, 32)
    async with media.internal_channel() as channel:
        stub = Stub(channel)
        held = await reserve_output(stub, owner, first, key="held")
        reply = await stub.ReserveOutputUploads(
            pb.ReserveOutputUploadsRequest(
                requests=[
                    declaration(owner, first, "one"),
                    declaration(owner, second, "two"),
                    declaration(owner, second, "gif", content_type="image/gif"),
                    # The key already holds another declaration.
                    declaration(owner, second, "held"),
                    declaration("", second, "nobody"),
                ]
            ),
            metadata=SERVICE,
        )
        one, two, gif, reused, nobody = reply.results
        assert one.reservation.asset.status == asset_pb2.ASSET_STATUS_UPLOADING
        assert one.reservation.upload_url and one.reservation.upload_method == "PUT"
        assert two.reservation.asset.asset_id not in ("", one.reservation.asset.asset_id)
        invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert item_failure(gif.error) == (invalid, "CONTENT_TYPE_NOT_ALLOWED", ["content_type"])
        assert item_failure(reused.error)[:2] == (
            grpc.StatusCode.ALREADY_EXISTS.value[0],
            "IDEMPOTENCY_KEY_REUSED",
        )
        assert item_failure(nobody.error) == (invalid, "INVALID_OWNER", ["owner_user_id"])
        # The refused items stored nothing; the one before them is untouched.
        assert await owned_rows(media, owner) == 3
        info = await stub.GetAssetInfo(
            pb.GetAssetInfoRequest(asset_id=held.asset.asset_id), metadata=SERVICE
        )
        assert info.asset.status == asset_pb2.ASSET_STATUS_UPLOADING

        await put_upload(one.reservation, first)
        done = await stub.CompleteOutputUploads(
            pb.CompleteOutputUploadsRequest(
                requests=[
                    pb.CompleteOutputUploadRequest(
                        asset_id=one.reservation.asset.asset_id,
                        owner_user_id=owner,
                        idempotency_key="one",
                    ),
                    # Reserved, never uploaded.
                    pb.CompleteOutputUploadRequest(
                        asset_id=two.reservation.asset.asset_id,
                        owner_user_id=owner,
                        idempotency_key="two",
                    ),
                    # Another owner's asset is not found.
                    pb.CompleteOutputUploadRequest(
                        asset_id=one.reservation.asset.asset_id,
                        owner_user_id="mallory",
                        idempotency_key="one",
                    ),
                    pb.CompleteOutputUploadRequest(
                        asset_id="not-a-uuid", owner_user_id=owner, idempotency_key="one"
                    ),
                ]
            ),
            metadata=SERVICE,
        )
        ready, missing, foreign, malformed = done.results
        assert ready.asset.status == asset_pb2.ASSET_STATUS_READY
        assert (ready.asset.width, ready.asset.height) == (64, 48)
        assert item_failure(missing.error)[:2] == (
            grpc.StatusCode.FAILED_PRECONDITION.value[0],
            "OBJECT_MISSING",
        )
        assert item_failure(foreign.error)[:2] == (
            grpc.StatusCode.NOT_FOUND.value[0],
            "ASSET_NOT_FOUND",
        )
        assert item_failure(malformed.error)[:2] == (invalid, "INVALID_ASSET_ID")
        # What was refused is as it was: the unuploaded output still waits for its bytes.
        info = await stub.GetAssetInfo(
            pb.GetAssetInfoRequest(asset_id=two.reservation.asset.asset_id), metadata=SERVICE
        )
        assert info.asset.status == asset_pb2.ASSET_STATUS_UPLOADING


@pytest.mark.parametrize("count", [0, 101])
async def test_a_batch_holds_1_to_100_items(
    local_media: MediaHarness, stub: Stub, count: int
) -> None:
    owner, png = str(uuid.uuid4()), noisy_png(8, 8)
    reserve = stub.ReserveOutputUploads(
        pb.ReserveOutputUploadsRequest(
            requests=[declaration(owner, png, f"k{i}") for i in range(count)]
        ),
        metadata=SERVICE,
    )
    assert await failure(reserve) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_BATCH")
    complete = stub.CompleteOutputUploads(
        pb.CompleteOutputUploadsRequest(
            requests=[
                pb.CompleteOutputUploadRequest(
                    asset_id=str(uuid.uuid4()), owner_user_id=owner, idempotency_key=f"k{i}"
                )
                for i in range(count)
            ]
        ),
        metadata=SERVICE,
    )
    assert await failure(complete) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_BATCH")
    assert await owned_rows(local_media, owner) == 0


async def test_the_batched_calls_need_the_service_credential(stub: Stub) -> None:
    user = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600)
    reserve = pb.ReserveOutputUploadsRequest(requests=[declaration("alice", noisy_png(8, 8), "k")])
    complete = pb.CompleteOutputUploadsRequest(
        requests=[
            pb.CompleteOutputUploadRequest(
                asset_id=str(uuid.uuid4()), owner_user_id="alice", idempotency_key="k"
            )
        ]
    )
    for call in (
        stub.ReserveOutputUploads(reserve, metadata=bearer(user)),
        stub.CompleteOutputUploads(complete, metadata=bearer(user)),
    ):
        assert await failure(call) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "SERVICE_CREDENTIAL_INVALID",
        )
