"""Hostile signed URLs against media's real object listener (local backend, real database):
whatever a client does to the query, it gets a 4xx JSON google.rpc.Status with a stable
reason, never a 500, and nothing is stored or served."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET
from services.media.domain import Status
from tests.support.media import (
    MediaHarness,
    SignedUrls,
    create_upload,
    http_status,
    image_bytes,
    media_settings,
    ready_asset,
    running_media,
)

ALICE = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)
JPEG = image_bytes("JPEG", 40, 30)
PERMISSION_DENIED, NOT_FOUND, INVALID_ARGUMENT = 7, 5, 3

Query = list[tuple[str, str]]


@pytest.fixture
async def media(media_url: str, tmp_path: Path) -> AsyncIterator[MediaHarness]:
    async with running_media(media_settings(media_url, tmp_path)) as harness:
        yield harness


@pytest.fixture
async def urls(media: MediaHarness) -> SignedUrls:
    return await ready_asset(media, ALICE, JPEG)


def split(url: str) -> tuple[str, Query]:
    """The URL without its query, and the query's pairs exactly as written (encoded)."""
    base, _, query = url.partition("?")
    return base, [(pair.partition("=")[0], pair.partition("=")[2]) for pair in query.split("&")]


def join(base: str, query: Query) -> str:
    return base + "?" + "&".join(f"{name}={value}" for name, value in query)


def replaced(name: str, value: str) -> Callable[[Query], Query]:
    return lambda query: [(n, value if n == name else v) for n, v in query]


def dropped(name: str) -> Callable[[Query], Query]:
    return lambda query: [(n, v) for n, v in query if n != name]


def repeated(name: str) -> Callable[[Query], Query]:
    return lambda query: query + [(n, v) for n, v in query if n == name]


MISMATCH = (403, PERMISSION_DENIED, "SIGNATURE_MISMATCH")
MISSING = (403, PERMISSION_DENIED, "SIGNATURE_MISSING")

# Changes to any signed URL, PUT or GET, and the answer each must get.
COMMON: dict[str, tuple[Callable[[Query], Query], tuple[int, int, str]]] = {
    "signature-non-ascii": (replaced("signature", "é" * 64), MISMATCH),
    "signature-one-non-ascii-char": (replaced("signature", "ü"), MISMATCH),
    "signature-percent-garbage": (replaced("signature", "%ff%fe%00%0d%0a"), MISMATCH),
    "signature-encoded-surrogate": (replaced("signature", "%ED%A0%80" * 21), MISMATCH),
    "signature-very-long": (replaced("signature", "a" * 6000), MISMATCH),
    "signature-empty": (replaced("signature", ""), MISSING),
    "signature-missing": (dropped("signature"), MISSING),
    "signature-twice": (repeated("signature"), MISMATCH),
    "expires-letters": (replaced("expires", "tomorrow"), MISMATCH),
    "expires-negative": (replaced("expires", "-1"), MISMATCH),
    "expires-huge": (replaced("expires", "9" * 4000), MISMATCH),
    "expires-exponent": (replaced("expires", "2e9"), MISMATCH),
    "expires-arabic-digits": (replaced("expires", "\u0661\u0667" + "\u0660" * 8), MISMATCH),
    "expires-encoded-space": (
        lambda q: [(n, "%20" + v if n == "expires" else v) for n, v in q],
        MISMATCH,
    ),
    "expires-empty": (replaced("expires", ""), MISSING),
    "expires-missing": (dropped("expires"), MISSING),
    "expires-twice": (repeated("expires"), MISMATCH),
    "whole-query-garbage": (lambda q: [("%ff%00", "%zz")], MISSING),
}
PUT_ONLY: dict[str, tuple[Callable[[Query], Query], tuple[int, int, str]]] = {
    "size-letters": (replaced("size", "big"), MISMATCH),
    "size-huge": (replaced("size", "1" + "0" * 30), MISMATCH),
    "size-negative": (replaced("size", "-5"), MISMATCH),
    "size-missing": (dropped("size"), MISSING),
    "size-twice": (repeated("size"), MISMATCH),
}
GET_ONLY: dict[str, tuple[Callable[[Query], Query], tuple[int, int, str]]] = {
    "type-missing": (dropped("type"), MISMATCH),
    "type-other": (replaced("type", "text%2Fhtml"), MISMATCH),
    "type-non-ascii": (replaced("type", "image/jpég"), MISMATCH),
    "type-header-injection": (replaced("type", "image%2Fjpeg%0d%0aX-Evil%3A%201"), MISMATCH),
    "type-twice": (repeated("type"), MISMATCH),
}


@pytest.mark.parametrize("case", sorted({**COMMON, **PUT_ONLY}))
async def test_hostile_upload_urls_are_refused_cleanly(media: MediaHarness, case: str) -> None:
    upload = await create_upload(media, ALICE, JPEG)
    headers = dict(upload.upload_headers)
    change, expected = {**COMMON, **PUT_ONLY}[case]
    base, query = split(upload.upload_url)
    async with httpx.AsyncClient() as client:
        response = await client.put(join(base, change(query)), content=JPEG, headers=headers)
        assert (response.status_code, *http_status(response)) == expected
        stored = await media.store.get(uuid.UUID(upload.asset.asset_id))
        assert stored is not None and stored.status == Status.UPLOADING
        assert await media.storage.stat(stored.object_key) is None
        # The URL as handed out still works: only the change was refused.
        untouched = await client.put(upload.upload_url, content=JPEG, headers=headers)
    assert untouched.status_code == 200


@pytest.mark.parametrize(
    ("content_type", "arrived"),
    [("image/png", "Content-Type 'image/png'"), (None, "no Content-Type")],
)
async def test_an_upload_without_its_signed_headers_is_told_to_send_upload_headers(
    media: MediaHarness, content_type: str | None, arrived: str
) -> None:
    """The signature covers the Content-Type given in uploadHeaders: a PUT with another
    one (or none) is refused, and the answer says which headers to send."""
    upload = await create_upload(media, ALICE, JPEG)
    assert dict(upload.upload_headers) == {"Content-Type": "image/jpeg"}
    headers = {"Content-Type": content_type} if content_type else {}
    async with httpx.AsyncClient() as client:
        response = await client.put(upload.upload_url, content=JPEG, headers=headers)
    assert (response.status_code, *http_status(response)) == MISMATCH
    message = response.json()["message"]
    assert "uploadHeaders" in message and "exactly as the upload answer gave it" in message
    assert f"this request had {arrived}" in message


async def test_an_upload_longer_than_signed_is_told_the_size_it_may_be(
    media: MediaHarness,
) -> None:
    upload = await create_upload(media, ALICE, b"x" * 3 * 1024)
    async with httpx.AsyncClient() as client:
        response = await client.put(
            upload.upload_url, content=b"x" * 4 * 1024, headers=dict(upload.upload_headers)
        )
    assert (response.status_code, *http_status(response)) == (413, INVALID_ARGUMENT, "TOO_LARGE")
    assert response.json()["message"] == "at most 3 KiB may be uploaded"


@pytest.mark.parametrize("case", sorted({**COMMON, **GET_ONLY}))
async def test_hostile_download_urls_are_refused_cleanly(urls: SignedUrls, case: str) -> None:
    change, expected = {**COMMON, **GET_ONLY}[case]
    base, query = split(urls.download_url)
    async with httpx.AsyncClient() as client:
        response = await client.get(join(base, change(query)))
        untouched = await client.get(urls.download_url)
    assert (response.status_code, *http_status(response)) == expected
    assert "x-evil" not in response.headers
    assert untouched.status_code == 200 and untouched.content == urls.data


async def test_unsigned_paths_methods_and_broken_http_get_json_statuses(
    urls: SignedUrls,
) -> None:
    base, query = split(urls.download_url)
    root = base.split("/media-objects/")[0]
    async with httpx.AsyncClient() as client:
        garbage_path = await client.get(root + "/media-objects/%ff%00..%2f..%2fetc")
        elsewhere = await client.get(root + "/v1/assets")
        wrong_method = await client.delete(urls.download_url)
        too_long = await client.get(join(base, [*query, ("pad", "x" * 20_000)]))
    assert (garbage_path.status_code, *http_status(garbage_path)) == (
        404,
        NOT_FOUND,
        "NO_SUCH_OBJECT",
    )
    assert (elsewhere.status_code, *http_status(elsewhere)) == (404, NOT_FOUND, "NO_SUCH_OBJECT")
    assert wrong_method.status_code == 405
    assert http_status(wrong_method)[1] == "METHOD_NOT_ALLOWED"
    assert wrong_method.headers["allow"] == "GET, HEAD, PUT"
    # Longer than any request line the listener reads: aiohttp refuses it, as JSON too.
    assert (too_long.status_code, *http_status(too_long)) == (
        400,
        INVALID_ARGUMENT,
        "MALFORMED_REQUEST",
    )
