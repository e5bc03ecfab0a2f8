"""Thumbnails of generated outputs and GetAssetUrls, on both storage backends, over a real
in-process media: once an output is stored, the thumbnail maker (one round of it here)
stores a WebP preview beside the object and records it; GetAssetUrls signs many assets
at once (the picture and its thumbnail, both downloadable), leaving out what is not
ready; GetAssetUrl and the public GetAsset hand out the thumbnail too; deleting the
asset removes both objects."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from PIL import Image
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
from services.media.domain import thumbnail_key
from services.media.storage import DownloadWindows
from tests.support.media import MediaHarness, media_settings, noisy_png, running_media
from tests.support.rpc import bearer, error_info

SERVICE = bearer(DEV_SERVICE_TOKEN)
Stub = media_internal_service_pb2_grpc.MediaInternalServiceStub


async def put(stub: Stub, data: bytes, purpose: int, owner: str = "alice") -> asset_pb2.Asset:
    async def parts() -> AsyncIterator[pb.PutAssetRequest]:
        yield pb.PutAssetRequest(
            header=pb.PutAssetHeader(owner_user_id=owner, purpose=purpose, content_type="image/png")
        )
        yield pb.PutAssetRequest(chunk=data)

    return (await stub.PutAsset(parts(), metadata=SERVICE)).asset


async def object_key_of(media: MediaHarness, asset_id: str) -> str:
    async with media.engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT object_key, thumbnail_content_type FROM media.assets"
                    " WHERE asset_id = :a"
                ),
                {"a": asset_id},
            )
        ).one()
    assert row.thumbnail_content_type == "image/webp"
    return str(row.object_key)


async def test_an_output_gets_a_thumbnail_that_every_url_call_hands_out(
    any_media: MediaHarness,
) -> None:
    media = any_media
    picture = noisy_png(600, 400)
    async with media.internal_channel() as internal, media.public_channel() as public:
        stub = Stub(internal)
        output = await put(stub, picture, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
        other = await put(stub, picture, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
        photo = await put(stub, picture, asset_pb2.ASSET_PURPOSE_AI_INPUT)
        await media.make_thumbnails()
        key = await object_key_of(media, output.asset_id)
        assert await media.storage.stat(thumbnail_key(key)) is not None

        asked = [output.asset_id, other.asset_id, photo.asset_id, str(uuid.uuid4()), "nope"]
        batch = await stub.GetAssetUrls(
            pb.GetAssetUrlsRequest(asset_ids=[*asked, output.asset_id]), metadata=SERVICE
        )
        # Unknown and malformed ids are left out; an input has no thumbnail.
        signed = {s.asset_id: s for s in batch.assets}
        assert set(signed) == {output.asset_id, other.asset_id, photo.asset_id}
        assert signed[photo.asset_id].url and not signed[photo.asset_id].thumbnail_url
        mine = signed[output.asset_id]
        assert mine.url_expire_time == mine.thumbnail_url_expire_time
        # Each carries the image's size, read from the stored object.
        assert {(s.width, s.height) for s in signed.values()} == {(600, 400)}
        assert mine.thumbnail_url != signed[other.asset_id].thumbnail_url

        single = await stub.GetAssetUrl(
            pb.GetAssetUrlRequest(asset_id=output.asset_id), metadata=SERVICE
        )
        token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600)
        owned = await media_service_pb2_grpc.MediaServiceStub(public).GetAsset(
            media_service_pb2.GetAssetRequest(asset_id=output.asset_id), metadata=bearer(token)
        )
        async with httpx.AsyncClient() as client:
            full = await client.get(mine.url)
            assert full.content == picture
            for url in (mine.thumbnail_url, single.thumbnail_url, owned.thumbnail_url):
                small = await client.get(url)
                assert small.status_code == 200
                assert small.headers["content-type"] == "image/webp"
                preview = Image.open(io.BytesIO(small.content))
                assert (preview.format, preview.size) == ("WEBP", (256, 171))
                assert len(small.content) < len(picture) // 10

            # Deleting the asset removes its thumbnail too, and it is signed no more.
            await stub.DeleteAsset(
                pb.DeleteAssetRequest(asset_id=output.asset_id), metadata=SERVICE
            )
            assert await media.storage.stat(key) is None
            assert await media.storage.stat(thumbnail_key(key)) is None
            assert (await client.get(mine.thumbnail_url)).status_code in (403, 404)
        again = await stub.GetAssetUrls(
            pb.GetAssetUrlsRequest(asset_ids=[output.asset_id]), metadata=SERVICE
        )
        assert list(again.assets) == []


async def test_urls_stay_the_same_within_a_window_and_say_what_the_image_is(
    any_media: MediaHarness,
) -> None:
    """Every URL call within one window (3600 s, epoch-aligned) hands out the same picture
    and thumbnail URLs, byte for byte, with the image's type, length and size; the next
    window's differ. Both download with Cache-Control."""
    media = any_media
    picture = noisy_png(300, 200)
    windows = DownloadWindows(3600, 300)
    start = windows.at(media.clock.now).signed_at
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 600)
    async with media.internal_channel() as internal, media.public_channel() as public:
        stub = Stub(internal)
        output = await put(stub, picture, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
        await media.make_thumbnails()
        ask = pb.GetAssetUrlsRequest(asset_ids=[output.asset_id])

        media.clock.now = start + timedelta(seconds=2)
        (first,) = (await stub.GetAssetUrls(ask, metadata=SERVICE)).assets
        assert (first.content_type, first.size_bytes) == ("image/png", len(picture))
        assert (first.width, first.height) == (300, 200)
        assert first.url_expire_time.ToDatetime() == (start + timedelta(seconds=3900)).replace(
            tzinfo=None
        )
        assert first.window_end_time.ToDatetime() == (start + timedelta(seconds=3600)).replace(
            tzinfo=None
        )
        await asyncio.sleep(1.1)  # S3 would sign another URL in another second
        media.clock.now = start + timedelta(seconds=3599)
        (again,) = (await stub.GetAssetUrls(ask, metadata=SERVICE)).assets
        assert again == first
        single = await stub.GetAssetUrl(
            pb.GetAssetUrlRequest(asset_id=output.asset_id), metadata=SERVICE
        )
        owned = await media_service_pb2_grpc.MediaServiceStub(public).GetAsset(
            media_service_pb2.GetAssetRequest(asset_id=output.asset_id), metadata=bearer(token)
        )
        assert single.download_url == owned.download_url == first.url
        assert single.thumbnail_url == owned.thumbnail_url == first.thumbnail_url

        media.clock.now = start + timedelta(seconds=3600)
        (following,) = (await stub.GetAssetUrls(ask, metadata=SERVICE)).assets
        assert following.url != first.url and following.thumbnail_url != first.thumbnail_url
        assert following.url_expire_time.seconds == first.url_expire_time.seconds + 3600

    async with httpx.AsyncClient() as client:
        for url, content_type in (
            (first.url, "image/png"),
            (first.thumbnail_url, "image/webp"),
            (following.url, "image/png"),
        ):
            response = await client.get(url)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == content_type
            assert response.headers["cache-control"] == "private, max-age=3900, immutable"
        assert len((await client.get(first.url)).content) == first.size_bytes


async def test_get_asset_urls_takes_at_most_100_ids(media_url: str, tmp_path: Path) -> None:
    async with (
        running_media(media_settings(media_url, tmp_path)) as media,
        media.internal_channel() as channel,
    ):
        stub = Stub(channel)
        empty = await stub.GetAssetUrls(pb.GetAssetUrlsRequest(), metadata=SERVICE)
        assert list(empty.assets) == []
        many = [str(uuid.uuid4()) for _ in range(101)]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetAssetUrls(pb.GetAssetUrlsRequest(asset_ids=many), metadata=SERVICE)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "INVALID_ASSET_ID"
        # A hundred distinct ids (repeats counted once) are fine.
        fine = await stub.GetAssetUrls(
            pb.GetAssetUrlsRequest(asset_ids=[*many[:100], many[0]]), metadata=SERVICE
        )
        assert list(fine.assets) == []
