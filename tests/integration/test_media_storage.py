"""Both storage backends against real servers: S3 against moto's S3-protocol HTTP server,
the local directory behind media's own HTTP listener. Clients really PUT bytes to the
presigned URLs and GET them back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import botocore.auth
import httpx
import pytest
from aiobotocore.session import AioSession

from services.dev.processes import free_port
from services.media.domain import Purpose, object_key
from services.media.http import ObjectHttpServer
from services.media.settings import S3Settings
from services.media.storage import (
    DownloadWindows,
    ObjectExists,
    ObjectNotFound,
    ObjectStorage,
    SignedRequest,
    WholeObject,
)
from services.media.storage.local import INCOMING, LocalStorage
from services.media.storage.s3 import PART_BYTES, S3Storage
from services.media.storage.signing import UrlSigner

SECRET = "local-test-url-secret-0123456789abcdef"
# The defaults: the storages below serve objects with this Cache-Control.
WINDOWS = DownloadWindows(window_seconds=3600, ttl_seconds=300)


def new_key(purpose: Purpose = Purpose.AI_INPUT) -> str:
    return object_key(purpose, uuid.uuid4(), datetime.now(UTC))


async def chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def read_all(storage: ObjectStorage, key: str, chunk_bytes: int = 64 * 1024) -> bytes:
    parts = [part async for part in storage.stream(key, chunk_bytes)]
    assert all(len(part) <= chunk_bytes for part in parts)
    return b"".join(parts)


def in_minutes(minutes: float) -> datetime:
    return datetime.now(UTC) + timedelta(minutes=minutes)


class Clock:
    """The HTTP listener's idea of now, in seconds since the epoch: the real time moved by
    ``offset``, or the moment ``at`` while one is set."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.at: float | None = None

    def __call__(self) -> float:
        if self.at is not None:
            return self.at
        return datetime.now(UTC).timestamp() + self.offset


@dataclass
class LocalObjects:
    storage: LocalStorage
    clock: Clock
    base_url: str


@pytest.fixture
async def local_objects(tmp_path: Path) -> AsyncIterator[LocalObjects]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    storage = LocalStorage(tmp_path / "objects", UrlSigner(SECRET, base_url))
    clock = Clock()
    server = ObjectHttpServer(storage, "127.0.0.1", port, clock=clock)
    serving = asyncio.create_task(server.serve_objects())
    yield LocalObjects(storage, clock, base_url)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving


@pytest.fixture
async def s3_storage(s3_bucket: S3Settings) -> AsyncIterator[S3Storage]:
    storage = S3Storage(s3_bucket)
    yield storage
    await storage.close()


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest) -> ObjectStorage:
    if request.param == "local":
        objects: LocalObjects = request.getfixturevalue("local_objects")
        return objects.storage
    found: S3Storage = request.getfixturevalue("s3_storage")
    return found


async def send(signed: SignedRequest, body: bytes | None = None, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.request(
            signed.method, signed.url, content=body, headers={**signed.headers, **headers}
        )


# -- the interface, on both backends ------------------------------------------------------


async def test_put_stat_stream_delete(storage: ObjectStorage) -> None:
    key = new_key()
    data = bytes(range(256)) * 1200
    await storage.put(key, chunks(data), "image/png")
    found = await storage.stat(key)
    assert found is not None and found.size_bytes == len(data)
    assert found.content_type in ("image/png", None)  # local keeps no content type
    assert await read_all(storage, key) == data
    await storage.delete(key)
    assert await storage.stat(key) is None
    await storage.delete(key)  # deleting a missing object succeeds


async def test_missing_objects(storage: ObjectStorage) -> None:
    key = new_key()
    assert await storage.stat(key) is None
    with pytest.raises(ObjectNotFound):
        await read_all(storage, key)


async def test_an_existing_object_is_never_replaced(storage: ObjectStorage) -> None:
    key = new_key()
    await storage.put(key, chunks(b"first"), "image/png")
    with pytest.raises(ObjectExists):
        await storage.put(key, chunks(b"second"), "image/png")
    assert await read_all(storage, key) == b"first"


async def test_presigned_put_then_get(storage: ObjectStorage) -> None:
    key = new_key()
    data = b"\x89PNG pretend image bytes" * 500
    upload = await storage.presign_put(key, "image/png", len(data), in_minutes(5))
    assert upload.method == "PUT" and upload.headers["Content-Type"] == "image/png"
    response = await send(upload, data)
    assert response.status_code == 200, response.text
    assert await read_all(storage, key) == data

    download = await storage.presign_get(key, "image/png", in_minutes(5))
    response = await send(download)
    assert response.status_code == 200
    assert response.content == data
    assert response.headers["content-type"] == "image/png"


async def test_a_presigned_put_cannot_replace_the_object(storage: ObjectStorage) -> None:
    key = new_key()
    upload = await storage.presign_put(key, "image/png", 5, in_minutes(5))
    assert (await send(upload, b"first")).status_code == 200
    assert (await send(upload, b"other")).status_code == 412
    assert await read_all(storage, key) == b"first"


# -- S3 specifics --------------------------------------------------------------------------


async def test_s3_presigned_put_signs_type_length_and_no_overwrite(s3_storage: S3Storage) -> None:
    upload = await s3_storage.presign_put(new_key(), "image/webp", 1234, in_minutes(5))
    query = parse_qs(urlsplit(upload.url).query)
    signed = set(query["X-Amz-SignedHeaders"][0].split(";"))
    assert {"content-type", "content-length", "if-none-match", "host"} <= signed
    assert upload.headers == {
        "Content-Type": "image/webp",
        "Content-Length": "1234",
        "If-None-Match": "*",
    }
    assert 0 < int(query["X-Amz-Expires"][0]) <= 300


async def test_s3_large_objects_go_up_in_parts(s3_storage: S3Storage) -> None:
    key = new_key(Purpose.AI_OUTPUT)
    data = bytes(range(251)) * (2 * PART_BYTES // 251 + 1000)  # two full parts and a tail
    assert len(data) > 2 * PART_BYTES
    await s3_storage.put(key, chunks(data, 256 * 1024), "image/png")
    found = await s3_storage.stat(key)
    assert found is not None and found.size_bytes == len(data)
    assert await read_all(s3_storage, key, 256 * 1024) == data


async def test_s3_public_endpoint_signs_urls_for_that_host(s3_bucket: S3Settings) -> None:
    storage = S3Storage(replace(s3_bucket, public_endpoint_url="https://files.example.com"))
    try:
        signed = await storage.presign_get(new_key(), "image/png", in_minutes(1))
        assert signed.url.startswith(f"https://files.example.com/{s3_bucket.bucket}/ai_input/")
    finally:
        await storage.close()


# -- the local backend's HTTP listener --------------------------------------------------------


async def test_local_listener_refuses_expired_urls(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()
    upload = await storage.presign_put(key, "image/png", 5, in_minutes(5))
    download_key = new_key()
    await storage.put(download_key, chunks(b"bytes"), "image/png")
    download = await storage.presign_get(download_key, "image/png", in_minutes(5))

    local_objects.clock.offset = 5 * 60 + 1
    put = await send(upload, b"hello")
    get = await send(download)
    assert (put.status_code, put.json()["error"]) == (403, "URL_EXPIRED")
    assert (get.status_code, get.json()["error"]) == (403, "URL_EXPIRED")
    assert await storage.stat(key) is None


def tampered(signed: SignedRequest, **changes: str) -> SignedRequest:
    parts = urlsplit(signed.url)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    query.update(changes)
    rebuilt = parts._replace(query="&".join(f"{k}={v}" for k, v in query.items()))
    return SignedRequest(signed.method, rebuilt.geturl(), signed.headers)


async def test_local_listener_refuses_tampered_urls(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()
    upload = await storage.presign_put(key, "image/png", 5, in_minutes(5))
    expires = int(parse_qs(urlsplit(upload.url).query)["expires"][0])
    for changed in (
        tampered(upload, size="500000"),
        tampered(upload, expires=str(expires + 3600)),
        tampered(upload, signature="0" * 64),
        SignedRequest("PUT", upload.url.replace(key, new_key()), upload.headers),
    ):
        response = await send(changed, b"hello")
        assert (response.status_code, response.json()["error"]) == (403, "SIGNATURE_MISMATCH")
    unsigned = SignedRequest("PUT", upload.url.split("?")[0], upload.headers)
    assert (await send(unsigned, b"hello")).status_code == 403
    assert await storage.stat(key) is None


async def test_local_listener_wants_the_signed_content_type(local_objects: LocalObjects) -> None:
    key = new_key()
    upload = await local_objects.storage.presign_put(key, "image/png", 5, in_minutes(5))
    response = await send(upload, b"hello", **{"Content-Type": "text/html"})
    assert (response.status_code, response.json()["error"]) == (403, "SIGNATURE_MISMATCH")


async def test_local_listener_enforces_the_declared_length(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()
    upload = await storage.presign_put(key, "image/png", 5, in_minutes(5))
    too_long = await send(upload, b"hello!")
    assert (too_long.status_code, too_long.json()["error"]) == (413, "TOO_LARGE")

    async def unknown_length() -> AsyncIterator[bytes]:
        yield b"hel"
        yield b"lo"

    async with httpx.AsyncClient() as client:
        chunked = await client.put(upload.url, content=unknown_length(), headers=upload.headers)
    assert (chunked.status_code, chunked.json()["error"]) == (411, "LENGTH_REQUIRED")
    assert await storage.stat(key) is None


async def test_local_listener_never_shows_a_broken_upload(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()
    upload = await storage.presign_put(key, "image/png", 1000, in_minutes(5))
    parts = urlsplit(upload.url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(
        f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
        "Content-Length: 1000\r\n\r\n".encode()
        + b"only a part"
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    # An object appears only once its last byte is in: never, here.
    download = await storage.presign_get(key, "image/png", in_minutes(5))
    assert (await send(download)).status_code == 404
    assert await storage.stat(key) is None


async def test_a_failed_local_write_leaves_no_file(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()

    async def breaks_off() -> AsyncIterator[bytes]:
        yield b"some bytes"
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await storage.put(key, breaks_off(), "image/png")
    assert await storage.stat(key) is None
    assert list((storage.root / INCOMING).iterdir()) == []


async def test_local_listener_serves_only_object_keys(local_objects: LocalObjects) -> None:
    async with httpx.AsyncClient() as client:
        for path in ("/media-objects/../../etc/passwd", "/media-objects/ai_input/x", "/other"):
            response = await client.get(local_objects.base_url + path)
            assert response.status_code == 404, path


async def test_local_listener_answers_head_and_marks_downloads(
    local_objects: LocalObjects,
) -> None:
    storage = local_objects.storage
    key = new_key()
    await storage.put(key, chunks(b"0123456789"), "image/jpeg")
    download = await storage.presign_get(key, "image/jpeg", in_minutes(5))
    async with httpx.AsyncClient() as client:
        head = await client.head(download.url)
        get = await client.get(download.url)
        swapped = await client.get(download.url.replace("image%2Fjpeg", "text%2Fhtml"))
    assert head.status_code == 200 and head.headers["content-length"] == "10"
    assert get.content == b"0123456789"
    assert get.headers["x-content-type-options"] == "nosniff"
    assert swapped.status_code == 403


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096])
async def test_objects_stream_whole_around_the_chunk_size(
    storage: ObjectStorage, size: int
) -> None:
    key = new_key()
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    await storage.put(key, chunks(data, 1000), "image/png")
    parts = [part async for part in storage.stream(key, 4096)]
    assert b"".join(parts) == data
    assert all(0 < len(part) <= 4096 for part in parts)


async def test_a_whole_object_in_memory_is_stored_like_a_stream(storage: ObjectStorage) -> None:
    key = new_key()
    data = bytes(range(256)) * 300
    await storage.put(key, WholeObject(data, 4096), "image/png")
    assert await read_all(storage, key) == data
    with pytest.raises(ObjectExists):
        await storage.put(key, WholeObject(b"other bytes", 4096), "image/png")
    assert await read_all(storage, key) == data


async def test_a_whole_local_object_leaves_no_part_behind(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key()
    await storage.put(key, WholeObject(b"first", 4096), "image/png")
    with pytest.raises(ObjectExists):
        await storage.put(key, WholeObject(b"second", 4096), "image/png")
    assert list((storage.root / INCOMING).iterdir()) == []
    assert storage.path_of(key).read_bytes() == b"first"


# -- download URLs per window: the same within one, a new one after, the old one still good


async def test_reads_within_a_window_get_the_same_url(storage: ObjectStorage) -> None:
    key = new_key(Purpose.AI_OUTPUT)
    data = b"\x89PNG an output" * 100
    await storage.put(key, chunks(data), "image/png")
    start = WINDOWS.at(datetime.now(UTC)).signed_at
    early = WINDOWS.at(start + timedelta(seconds=1))
    late = WINDOWS.at(start + timedelta(seconds=3599))
    first = await storage.presign_get(key, "image/png", early.expires_at, early.signed_at)
    # S3 signs to the second: a URL signed now, a second later, would differ.
    await asyncio.sleep(1.1)
    second = await storage.presign_get(key, "image/png", late.expires_at, late.signed_at)
    assert second == first

    following = WINDOWS.at(start + timedelta(seconds=3600))
    other = await storage.presign_get(key, "image/png", following.expires_at, following.signed_at)
    assert other.url != first.url

    for signed in (first, other):
        response = await send(signed)
        assert response.status_code == 200, response.text
        assert response.content == data
        assert response.headers["content-type"] == "image/png"
        assert response.headers["cache-control"] == "private, max-age=3900, immutable"


async def test_without_a_window_s3_signs_anew_every_second(s3_storage: S3Storage) -> None:
    """What the windows are for: botocore's own presigns differ from one second to the next."""
    key = new_key()
    first = await s3_storage.presign_get(key, "image/png", in_minutes(5))
    await asyncio.sleep(1.1)
    assert (await s3_storage.presign_get(key, "image/png", in_minutes(5))).url != first.url


async def test_a_local_url_works_until_its_expiry(local_objects: LocalObjects) -> None:
    storage = local_objects.storage
    key = new_key(Purpose.AI_OUTPUT)
    await storage.put(key, chunks(b"bytes"), "image/webp")
    now = datetime.now(UTC)
    validity = WINDOWS.at(now)
    old = await storage.presign_get(key, "image/webp", validity.expires_at, validity.signed_at)
    following = WINDOWS.at(validity.signed_at + timedelta(seconds=3600))
    new = await storage.presign_get(key, "image/webp", following.expires_at, following.signed_at)

    # Into the next window, the TTL less a second after it began: both URLs work...
    local_objects.clock.at = validity.expires_at.timestamp() - 1
    assert (await send(old)).status_code == 200
    assert (await send(new)).status_code == 200
    # ...and at the old one's expiry only the new one does.
    local_objects.clock.at = validity.expires_at.timestamp()
    expired = await send(old)
    assert (expired.status_code, expired.json()["error"]) == (403, "URL_EXPIRED")
    assert (await send(new)).status_code == 200


async def test_an_s3_url_is_botocores_own_signed_at_the_window_start(
    s3_storage: S3Storage, s3_bucket: S3Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 accepts a presigned URL from its X-Amz-Date for X-Amz-Expires seconds: ours is
    byte for byte the URL botocore makes at the window's start, valid until the expiry."""
    key = new_key(Purpose.AI_OUTPUT)
    validity = WINDOWS.at(datetime.now(UTC))
    ours = await s3_storage.presign_get(key, "image/jpeg", validity.expires_at, validity.signed_at)
    query = parse_qs(urlsplit(ours.url).query)
    assert query["X-Amz-Date"] == [validity.signed_at.strftime("%Y%m%dT%H%M%SZ")]
    assert query["X-Amz-Expires"] == ["3900"]
    assert query["response-cache-control"] == ["private, max-age=3900, immutable"]

    at_start = validity.signed_at.replace(tzinfo=None)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *_, **__: at_start)
    async with AioSession().create_client(
        "s3",
        endpoint_url=s3_bucket.endpoint_url,
        region_name=s3_bucket.region,
        aws_access_key_id=s3_bucket.access_key_id,
        aws_secret_access_key=s3_bucket.secret_access_key,
        config=s3_storage._client_args("")["config"],
    ) as plain:
        botocores = await plain.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": s3_bucket.bucket,
                "Key": key,
                "ResponseContentType": "image/jpeg",
                "ResponseCacheControl": "private, max-age=3900, immutable",
            },
            ExpiresIn=3900,
        )
    assert ours.url == botocores


async def test_s3_objects_are_stored_with_cache_control(
    s3_storage: S3Storage, s3_bucket: S3Settings
) -> None:
    small, large = new_key(Purpose.AI_OUTPUT), new_key(Purpose.AI_OUTPUT)
    await s3_storage.put(small, chunks(b"small"), "image/png")
    await s3_storage.put(large, chunks(bytes(PART_BYTES + 10), 256 * 1024), "image/png")
    async with AioSession().create_client(
        "s3",
        endpoint_url=s3_bucket.endpoint_url,
        region_name=s3_bucket.region,
        aws_access_key_id=s3_bucket.access_key_id,
        aws_secret_access_key=s3_bucket.secret_access_key,
    ) as plain:
        for key in (small, large):  # one PUT, and a multipart upload
            head = await plain.head_object(Bucket=s3_bucket.bucket, Key=key)
            assert head["CacheControl"] == "private, max-age=3900, immutable"
