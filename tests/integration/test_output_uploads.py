"""An output's way into media as the in-process worker lands it, on both backends (the
local one through media's object listener, S3 on the moto server): reserved with its
declared size, type and hash over gRPC (creation's MediaClient), its bytes PUT to the
signed URL (creation's ObjectTransfer), then committed by one unary call that checks
the stored object. Hostile files sent this way never become READY. An input is read
back through its signed GET URL, never through ReadAsset."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.creation.media_client import AssetRefused, AssetUnreadable, MediaClient
from services.creation.object_transfer import ObjectTransfer
from services.kit.settings import DEV_SERVICE_TOKEN
from services.media.settings import S3Settings
from services.media.storage.s3 import S3Storage
from tests.support.media import (
    MediaHarness,
    image_bytes,
    media_settings,
    noisy_jpeg,
    pixel_bomb_png,
    running_media,
)

MAX_UPLOAD = 256 * 1024
# A loaded machine opens a database connection in seconds, not milliseconds: the tests
# judge uploads, not the machine's speed.
PATIENT = {
    "DB_CONNECT_TIMEOUT": "8",
    "DB_POOL_TIMEOUT": "8",
    "DB_STATEMENT_TIMEOUT": "8",
}


def flipped(data: bytes) -> bytes:
    """The same length, one bit of the pixel data changed."""
    changed = bytearray(data)
    changed[len(data) // 2] ^= 1
    return bytes(changed)


MAX_PIXELS = 4_000_000


@pytest.fixture
async def media(
    bucket: S3Settings | None, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    settings = media_settings(
        media_url,
        tmp_path,
        MAX_UPLOAD_BYTES=str(MAX_UPLOAD),
        MEDIA_MAX_IMAGE_PIXELS=str(MAX_PIXELS),
        **PATIENT,
    )
    async with running_media(settings, None if bucket is None else S3Storage(bucket)) as harness:
        yield harness


@pytest.fixture
async def client(media: MediaHarness) -> AsyncIterator[MediaClient]:
    media_client = MediaClient(
        f"127.0.0.1:{media.running.internal_port}", DEV_SERVICE_TOKEN, timeout_seconds=10
    )
    yield media_client
    await media_client.close()


@pytest.fixture
async def transfer() -> AsyncIterator[ObjectTransfer]:
    made = ObjectTransfer()
    yield made
    await made.close()


async def land(
    client: MediaClient,
    transfer: ObjectTransfer,
    owner: str,
    data: bytes,
    content_type: str = "image/png",
    key: str | None = None,
    sent: bytes | None = None,
) -> str:
    """The worker's three steps; ``sent``: other bytes than those declared."""
    key = key or f"creation:job:{uuid.uuid4()}:attempt:1:output:0"
    upload = await client.reserve_output(
        owner, content_type, len(data), hashlib.sha256(data).hexdigest(), key
    )
    if upload.url:
        await transfer.upload(upload, data if sent is None else sent)
    return await client.complete_output(owner, upload.asset_id, key)


async def statuses(media: MediaHarness, owner: str) -> list[str]:
    async with media.engine.connect() as connection:
        rows = await connection.exec_driver_sql(
            "SELECT status FROM media.assets WHERE owner_user_id = $1", (owner,)
        )
        return [row.status for row in rows]


async def test_an_output_put_to_its_signed_url_is_committed_ready_for_its_owner(
    media: MediaHarness, client: MediaClient, transfer: ObjectTransfer
) -> None:
    owner = str(uuid.uuid4())
    data = image_bytes("PNG", 120, 80)
    key = f"creation:job:{uuid.uuid4()}:attempt:1:output:0"
    asset_id = await land(client, transfer, owner, data, key=key)
    info = await client.asset_info(asset_id)
    assert info is not None and (info.owner_user_id, info.purpose, info.status) == (
        owner,
        "ai_output",
        "ready",
    )
    # A resumed attempt under the same key finds it committed: no URL, the same asset.
    assert await land(client, transfer, owner, data, key=key) == asset_id
    # Read back as a worker reads an input: by its signed GET URL.
    signed = await client.readable_url(asset_id)
    read, content_type = await transfer.download(signed.url, MAX_UPLOAD, "the output")
    assert (read, content_type) == (data, "image/png")
    with pytest.raises(AssetUnreadable, match="larger than"):
        await transfer.download(signed.url, len(data) - 1, "the output")


async def test_an_upload_killed_before_its_commit_is_committed_by_the_resumed_attempt(
    media: MediaHarness, client: MediaClient, transfer: ObjectTransfer
) -> None:
    """The PUT landed, the commit never came (the worker died): the next reservation under
    the key answers the same asset, its PUT finds the object there, the commit takes it."""
    owner = str(uuid.uuid4())
    data = image_bytes("PNG", 50, 40)
    key = f"creation:job:{uuid.uuid4()}:attempt:1:output:0"
    first = await client.reserve_output(
        owner, "image/png", len(data), hashlib.sha256(data).hexdigest(), key
    )
    await transfer.upload(first, data)
    assert await statuses(media, owner) == ["uploading"]
    assert await land(client, transfer, owner, data, key=key) == first.asset_id
    assert await statuses(media, owner) == ["ready"]


async def test_a_commit_judges_the_row_as_it_is_now_not_as_it_was_reserved(
    media: MediaHarness, client: MediaClient, transfer: ObjectTransfer
) -> None:
    """media remembers what it reserved for the commit, but the row decides: a rejection
    recorded meanwhile (another replica's check) still lets this upload be committed, and
    a deletion meanwhile refuses the commit."""
    owner = str(uuid.uuid4())
    data = image_bytes("PNG", 30, 20)
    key = f"creation:job:{uuid.uuid4()}:attempt:1:output:0"
    upload = await client.reserve_output(
        owner, "image/png", len(data), hashlib.sha256(data).hexdigest(), key
    )
    async with media.engine.begin() as connection:
        await connection.exec_driver_sql(
            "UPDATE media.assets SET rejected_uploads = rejected_uploads + 1"
            " WHERE owner_user_id = $1",
            (owner,),
        )
    await transfer.upload(upload, data)
    assert await client.complete_output(owner, upload.asset_id, key) == upload.asset_id
    assert await statuses(media, owner) == ["ready"]

    other_key = f"creation:job:{uuid.uuid4()}:attempt:1:output:0"
    second = await client.reserve_output(
        owner, "image/png", len(data), hashlib.sha256(data).hexdigest(), other_key
    )
    await transfer.upload(second, data)
    assert await client.delete_keyed_assets(owner, [other_key]) == 1
    with pytest.raises(AssetRefused, match="ASSET_DELETED"):
        await client.complete_output(owner, second.asset_id, other_key)
    assert sorted(await statuses(media, owner)) == ["deleted", "ready"]


@pytest.mark.parametrize(
    ("name", "data", "content_type", "sent"),
    [
        # Kilobytes that claim 100 megapixels: refused from the header, never decoded.
        ("pixel bomb", pixel_bomb_png(10_000, 10_000), "image/png", None),
        ("JPEG declared as PNG", image_bytes("JPEG", 64, 48), "image/png", None),
        ("not an image", b"MZ\x90\x00" + b"\x00" * 2000, "image/png", None),
        # As declared in size and type, but other bytes than the declared hash's.
        ("other bytes", image_bytes("PNG"), "image/png", flipped(image_bytes("PNG"))),
    ],
)
async def test_a_hostile_output_is_refused_and_never_ready(
    bucket: S3Settings | None,
    media: MediaHarness,
    client: MediaClient,
    transfer: ObjectTransfer,
    name: str,
    data: bytes,
    content_type: str,
    sent: bytes | None,
) -> None:
    owner = str(uuid.uuid4())
    if sent is not None and bucket is not None:
        # S3 checks the signed x-amz-checksum-sha256 itself and answers BadDigest to other
        # bytes; moto does not check it. What this test can see: the PUT is signed with
        # the declared hash, so S3 would refuse them.
        upload = await client.reserve_output(
            owner, content_type, len(data), hashlib.sha256(data).hexdigest(), "creation:k:other"
        )
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        assert upload.headers["x-amz-checksum-sha256"] == checksum
        signed_headers = upload.url.split("X-Amz-SignedHeaders=")[1].split("&")[0]
        assert "x-amz-checksum-sha256" in signed_headers.split("%3B")
        return
    with pytest.raises(AssetRefused):
        await land(client, transfer, owner, data, content_type, sent=sent)
    assert "ready" not in await statuses(media, owner), name


async def test_an_output_over_the_size_limit_is_refused_before_any_byte_is_sent(
    media: MediaHarness, client: MediaClient
) -> None:
    owner = str(uuid.uuid4())
    big = noisy_jpeg(MAX_UPLOAD + 1)
    with pytest.raises(AssetRefused, match="INVALID_ARGUMENT"):
        await client.reserve_output(
            owner, "image/jpeg", len(big), hashlib.sha256(big).hexdigest(), "creation:k:big"
        )
    assert await statuses(media, owner) == []


async def test_a_body_over_the_signed_size_is_refused_at_the_put(
    media: MediaHarness, client: MediaClient
) -> None:
    """Whatever the uploader sends, the store takes no more than was declared (local:
    media's listener answers 413 before reading; S3: the length is signed)."""
    owner = str(uuid.uuid4())
    data = image_bytes("PNG")
    upload = await client.reserve_output(
        owner, "image/png", len(data), hashlib.sha256(data).hexdigest(), "creation:k:long"
    )
    headers = {k: v for k, v in upload.headers.items() if k.lower() != "content-length"}
    async with httpx.AsyncClient() as http:
        answer = await http.put(upload.url, headers=headers, content=data + b"x" * MAX_UPLOAD)
    if answer.is_success:
        # moto does not check a signed length; media's commit does.
        with pytest.raises(AssetRefused):
            await client.complete_output(owner, upload.asset_id, "creation:k:long")
    else:
        assert answer.status_code in (400, 403, 413), answer.text
    assert "ready" not in await statuses(media, owner)


@pytest.fixture
async def thumbnailing_media(
    bucket: S3Settings | None, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    """media with its thumbnail maker running, as in service."""
    settings = media_settings(
        media_url,
        tmp_path,
        MAX_UPLOAD_BYTES=str(MAX_UPLOAD),
        MEDIA_THUMBNAIL_BACKFILL_BATCH="20",
        MEDIA_THUMBNAIL_POLL="0.2",
        **PATIENT,
    )
    async with running_media(settings, None if bucket is None else S3Storage(bucket)) as harness:
        yield harness


def patient_client(media: MediaHarness) -> MediaClient:
    return MediaClient(
        f"127.0.0.1:{media.running.internal_port}", DEV_SERVICE_TOKEN, timeout_seconds=10
    )


async def thumbnail_state(media: MediaHarness, asset_id: str) -> tuple[str | None, str | None]:
    async with media.engine.connect() as connection:
        row = (
            await connection.exec_driver_sql(
                "SELECT thumbnail_content_type, thumbnail_failure FROM media.assets"
                " WHERE asset_id = $1",
                (uuid.UUID(asset_id),),
            )
        ).one()
    return row.thumbnail_content_type, row.thumbnail_failure


async def until_thumbnail_settled(
    media: MediaHarness, asset_id: str
) -> tuple[str | None, str | None]:
    deadline = time.monotonic() + 20
    while True:
        state = await thumbnail_state(media, asset_id)
        if state != (None, None):
            return state
        assert time.monotonic() < deadline, "the thumbnail maker never took the output"
        await asyncio.sleep(0.05)


async def test_the_thumbnail_follows_the_commit_in_the_background(
    thumbnailing_media: MediaHarness, transfer: ObjectTransfer
) -> None:
    """The commit answers READY without a preview; media makes it afterwards, and from
    then on the output's URLs include it."""
    media = thumbnailing_media
    client = patient_client(media)
    try:
        owner = str(uuid.uuid4())
        asset_id = await land(client, transfer, owner, image_bytes("PNG", 400, 300))
        assert await until_thumbnail_settled(media, asset_id) == ("image/webp", None)
        urls = await client.output_urls([asset_id])
        thumbnail = urls[asset_id].thumbnail
        assert thumbnail is not None
        async with httpx.AsyncClient() as http:
            got = await http.get(thumbnail.url)
        assert got.status_code == 200 and got.content[:4] == b"RIFF"
    finally:
        await client.close()


async def test_the_commit_reads_the_header_only_and_the_thumbnail_maker_finds_a_broken_body(
    thumbnailing_media: MediaHarness, transfer: ObjectTransfer
) -> None:
    """A PNG whose header is sound and whose pixel data is not: the commit judges the
    header (format, size, pixel count) and makes it READY without decoding a pixel; the
    thumbnail maker, which does decode, marks it not decodable, and it never gets a
    preview (its picture's URL still works)."""
    media = thumbnailing_media
    client = patient_client(media)
    try:
        data = bytearray(image_bytes("PNG", 200, 150))
        start = data.index(b"IDAT") + 4
        data[start : start + 64] = b"\x00" * 64  # the compressed pixels, wiped
        asset_id = await land(client, transfer, str(uuid.uuid4()), bytes(data))
        info = await client.asset_info(asset_id)
        assert info is not None and info.status == "ready"
        assert await until_thumbnail_settled(media, asset_id) == (None, "not_decodable")
        urls = await client.output_urls([asset_id])
        assert urls[asset_id].image.url and urls[asset_id].thumbnail is None
    finally:
        await client.close()
