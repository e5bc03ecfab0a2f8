"""Housekeeping's thumbnail backfill, over real PostgreSQL and both storage backends: an
output stored before thumbnails existed (its row and object written directly, as such an
asset was) gets a WebP preview that GetAssetUrls then signs; an object that is gone or
not an image is marked and never taken again; two replicas at once never make the same
thumbnail twice; a round takes at most its batch. (The service's own housekeeping loop
does not backfill here: the harness turns it off, and each test runs its rounds.)"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from PIL import Image
from sqlalchemy import text

from atelier.media.v1 import media_internal_service_pb2 as pb
from atelier.media.v1 import media_internal_service_pb2_grpc
from services.kit.db import create_engine
from services.kit.settings import DEV_SERVICE_TOKEN
from services.media.domain import Purpose, object_key, thumbnail_key
from services.media.errors import DatabaseFailed, StorageUnavailable
from services.media.housekeeping import Housekeeper
from services.media.storage import ObjectStat, ObjectStorage, SignedRequest, WholeObject
from services.media.store.assets import AssetStore
from services.media.thumbnail_backfill import DEFAULT_STALE_AFTER, ThumbnailBackfill
from services.media.thumbnails import Thumbnailer
from tests.support.media import MediaHarness, media_settings, noisy_png, running_media
from tests.support.pg_outage import OwnPostgres, own_migrated
from tests.support.rpc import bearer

SERVICE = bearer(DEV_SERVICE_TOKEN)


class CountingStorage:
    """The harness's storage, counting the thumbnails written and the objects read."""

    def __init__(self, inner: ObjectStorage, *, down: bool = False) -> None:
        self._inner = inner
        self.puts: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self._down = down

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        self.puts[key] += 1
        await self._inner.put(key, chunks, content_type)

    async def stream(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        self.reads[key] += 1
        if self._down:
            raise StorageUnavailable()
        async for chunk in self._inner.stream(key, chunk_bytes):
            yield chunk

    async def stat(self, key: str) -> ObjectStat | None:
        return await self._inner.stat(key)

    async def delete(self, key: str) -> None:
        await self._inner.delete(key)

    async def presign_put(
        self, key: str, content_type: str, size_bytes: int, expires_at: datetime
    ) -> SignedRequest:
        return await self._inner.presign_put(key, content_type, size_bytes, expires_at)

    async def presign_get(self, key: str, content_type: str, expires_at: datetime) -> SignedRequest:
        return await self._inner.presign_get(key, content_type, expires_at)

    async def remove_abandoned_writes(self, older_than: datetime, limit: int) -> int:
        return await self._inner.remove_abandoned_writes(older_than, limit)

    async def close(self) -> None:
        pass


def housekeeper(media: MediaHarness, storage: ObjectStorage, batch: int) -> Housekeeper:
    """A replica's housekeeping with the backfill on, as media.app builds it."""
    backfill = ThumbnailBackfill(
        media.store,
        storage,
        Thumbnailer(media.settings.max_image_pixels),
        batch=batch,
        chunk_bytes=media.settings.chunk_bytes,
    )
    return Housekeeper(
        media.store,
        storage,
        period_seconds=60,
        batch_size=100,
        clock=media.clock,
        backfill=backfill,
    )


async def old_output(
    media: MediaHarness, data: bytes | None, *, size: tuple[int, int] = (600, 400)
) -> tuple[str, str]:
    """A ready output as stored before migration 0005: its object (unless ``data`` is
    None: lost) and a row without a thumbnail. Returns (asset id, object key)."""
    asset_id = uuid.uuid4()
    created = media.clock.now - timedelta(days=40)
    key = object_key(Purpose.AI_OUTPUT, asset_id, created)
    body = data if data is not None else b"lost"
    if data is not None:
        await media.storage.put(key, WholeObject(data, 64 * 1024), "image/png")
    async with media.engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO media.assets (asset_id, owner_user_id, purpose, status,"
                " content_type, size_bytes, sha256, width, height, object_key, created_at,"
                " ready_at) VALUES (:id, 'alice', 'ai_output', 'ready', 'image/png', :size,"
                " :sha, :w, :h, :key, :created, :created)"
            ),
            {
                "id": asset_id,
                "size": len(body),
                "sha": hashlib.sha256(body).hexdigest(),
                "w": size[0],
                "h": size[1],
                "key": key,
                "created": created,
            },
        )
    return str(asset_id), key


async def backfill_columns(media: MediaHarness, asset_id: str) -> tuple[str | None, str | None]:
    """(thumbnail_content_type, thumbnail_failure) of the asset; its claim is let go."""
    async with media.engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT thumbnail_content_type, thumbnail_failure, thumbnail_claimed_at"
                    " FROM media.assets WHERE asset_id = :a"
                ),
                {"a": asset_id},
            )
        ).one()
    assert row.thumbnail_claimed_at is None
    return row.thumbnail_content_type, row.thumbnail_failure


async def signed_thumbnail(media: MediaHarness, asset_id: str) -> str:
    async with media.internal_channel() as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        answer = await stub.GetAssetUrls(
            pb.GetAssetUrlsRequest(asset_ids=[asset_id]), metadata=SERVICE
        )
    [urls] = answer.assets
    assert urls.url
    return urls.thumbnail_url


async def test_an_old_output_gets_a_thumbnail_that_get_asset_urls_signs(
    any_media: MediaHarness,
) -> None:
    media = any_media
    picture = noisy_png(600, 400)
    asset_id, key = await old_output(media, picture)
    assert await signed_thumbnail(media, asset_id) == ""  # the known gap

    storage = CountingStorage(media.storage)
    done = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert (done.made, done.failed) == (1, 0)
    assert await backfill_columns(media, asset_id) == ("image/webp", None)
    assert storage.puts == {thumbnail_key(key): 1}

    url = await signed_thumbnail(media, asset_id)
    assert url
    async with httpx.AsyncClient() as client:
        small = await client.get(url)
    assert small.status_code == 200
    assert small.headers["content-type"] == "image/webp"
    preview = Image.open(io.BytesIO(small.content))
    assert (preview.format, preview.size) == ("WEBP", (256, 171))

    # Done for good: the next round reads and writes nothing, even with old claims.
    media.clock.advance(DEFAULT_STALE_AFTER.total_seconds() + 1)
    again = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert (again.made, again.failed) == (0, 0)
    assert storage.puts == {thumbnail_key(key): 1}
    assert storage.reads == {key: 1}


async def test_a_missing_or_undecodable_object_is_marked_and_skipped_next_round(
    any_media: MediaHarness,
) -> None:
    media = any_media
    missing, missing_key = await old_output(media, None)
    garbage, garbage_key = await old_output(media, b"\x89PNG\r\n\x1a\n not really" * 50)
    good, good_key = await old_output(media, noisy_png(300, 300))

    storage = CountingStorage(media.storage)
    # One round takes all three; the bad two do not stop the good one.
    done = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert (done.made, done.failed) == (1, 2)
    assert await backfill_columns(media, missing) == (None, "object_missing")
    assert await backfill_columns(media, garbage) == (None, "not_decodable")
    assert await backfill_columns(media, good) == ("image/webp", None)
    assert await media.storage.stat(thumbnail_key(garbage_key)) is None
    assert await signed_thumbnail(media, garbage) == ""

    media.clock.advance(DEFAULT_STALE_AFTER.total_seconds() + 1)
    again = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert (again.made, again.failed) == (0, 0)
    assert storage.reads == {missing_key: 1, garbage_key: 1, good_key: 1}


async def test_two_replicas_at_once_never_make_the_same_thumbnail_twice(
    any_media: MediaHarness,
) -> None:
    media = any_media
    outputs = [await old_output(media, noisy_png(200 + i, 150)) for i in range(20)]
    storage = CountingStorage(media.storage)
    first, second = await asyncio.gather(
        housekeeper(media, storage, batch=100).backfill_thumbnails(media.clock.now),
        housekeeper(media, storage, batch=100).backfill_thumbnails(media.clock.now),
    )
    assert first.made + second.made == len(outputs)
    assert storage.puts == {thumbnail_key(key): 1 for _, key in outputs}
    assert storage.reads == {key: 1 for _, key in outputs}
    for asset_id, _ in outputs:
        assert await backfill_columns(media, asset_id) == ("image/webp", None)


class DeletingStorage(CountingStorage):
    """Deletes one asset just as its thumbnail is stored (a DeleteAsset racing the
    backfill, after the claim and before the chunk's thumbnails are recorded)."""

    def __init__(self, inner: ObjectStorage, media: MediaHarness, asset_id: str) -> None:
        super().__init__(inner)
        self._media = media
        self._asset_id = uuid.UUID(asset_id)

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        await super().put(key, chunks, content_type)
        deleted = await self._media.store.get(self._asset_id)
        if deleted is not None and thumbnail_key(deleted.object_key) == key:
            await self._media.store.mark_deleted(self._asset_id, self._media.clock.now)


async def test_a_thumbnail_of_an_asset_deleted_meanwhile_is_removed_and_the_others_recorded(
    any_media: MediaHarness,
) -> None:
    media = any_media
    outputs = [await old_output(media, noisy_png(90 + i, 70)) for i in range(3)]
    gone, gone_key = outputs[1]
    storage = DeletingStorage(media.storage, media, gone)
    done = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert (done.made, done.failed) == (2, 0)
    assert storage.puts == {thumbnail_key(key): 1 for _, key in outputs}
    assert await media.storage.stat(thumbnail_key(gone_key)) is None
    for asset_id, key in outputs:
        if asset_id != gone:
            assert await backfill_columns(media, asset_id) == ("image/webp", None)
            assert await media.storage.stat(thumbnail_key(key)) is not None


async def test_a_round_takes_at_most_its_batch(any_media: MediaHarness) -> None:
    media = any_media
    outputs = [await old_output(media, noisy_png(100, 80 + i)) for i in range(12)]
    storage = CountingStorage(media.storage)

    off = await housekeeper(media, storage, batch=0).backfill_thumbnails(media.clock.now)
    assert (off.made, off.failed, len(storage.reads)) == (0, 0, 0)

    # Past one claim's size (8): the bound holds across claims.
    made = []
    for _ in range(3):
        done = await housekeeper(media, storage, batch=5).backfill_thumbnails(media.clock.now)
        made.append(done.made)
        assert len(storage.puts) == sum(made)
    assert made == [5, 5, 2]
    big = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert big.made == 0
    assert storage.puts == {thumbnail_key(key): 1 for _, key in outputs}


async def test_storage_down_postpones_the_round_and_hands_the_claims_back(
    any_media: MediaHarness,
) -> None:
    media = any_media
    asset_id, key = await old_output(media, noisy_png(64, 64))
    down = CountingStorage(media.storage, down=True)
    with pytest.raises(StorageUnavailable):
        await housekeeper(media, down, batch=10).backfill_thumbnails(media.clock.now)
    # Handed back, unmarked: the next round (same moment, no stale wait) takes it.
    assert await backfill_columns(media, asset_id) == (None, None)
    storage = CountingStorage(media.storage)
    done = await housekeeper(media, storage, batch=10).backfill_thumbnails(media.clock.now)
    assert done.made == 1
    assert storage.puts == {thumbnail_key(key): 1}


async def test_the_service_backfills_in_its_housekeeping_loop(
    media_url: str, tmp_path: Path
) -> None:
    # media as app.build wires it: the setting on, a short period.
    settings = media_settings(
        media_url,
        tmp_path,
        MEDIA_HOUSEKEEPING_PERIOD="0.1",
        MEDIA_THUMBNAIL_BACKFILL_BATCH="5",
    )
    async with running_media(settings) as media:
        asset_id, key = await old_output(media, noisy_png(320, 200))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        # Nothing signals a round's end: poll the row, with a deadline.
        while (await thumbnail_of(media, asset_id)) is None:
            assert loop.time() < deadline, "the loop never made the thumbnail"
            await asyncio.sleep(0.05)
        assert await thumbnail_of(media, asset_id) == "image/webp"
        assert await media.storage.stat(thumbnail_key(key)) is not None
        assert await signed_thumbnail(media, asset_id)


async def thumbnail_of(media: MediaHarness, asset_id: str) -> str | None:
    async with media.engine.connect() as connection:
        found = await connection.execute(
            text("SELECT thumbnail_content_type FROM media.assets WHERE asset_id = :a"),
            {"a": asset_id},
        )
        value: str | None = found.scalar_one()
    return value


@pytest.fixture
def own_pg() -> Iterator[tuple[OwnPostgres, str]]:
    """A PostgreSQL of this test's own with media's schema, which it stops and freezes."""
    with own_migrated("media") as made:
        yield made


async def test_the_database_stopped_or_frozen_fails_a_round_fast_and_the_next_one_makes_it(
    own_pg: tuple[OwnPostgres, str], tmp_path: Path
) -> None:
    """A PostgreSQL of the test's own, stopped and then frozen (SIGSTOP) between rounds: a
    round with the database gone raises DatabaseFailed within the deadlines (the loop
    logs it and waits a period), and once it is back the next round makes the thumbnail
    with the same engine — no restart."""
    pg, url = own_pg
    settings = media_settings(url, tmp_path)
    async with running_media(settings) as media:
        asset_id, key = await old_output(media, noisy_png(300, 200))
        # The store as media.app builds it: the kit's engine, with its deadlines.
        engine = create_engine(url, limits=settings.common.database)
        try:
            # (The harness's own engine lacks its hooks: its connections die with the
            # server, so the checks below read through this one too.)
            kit_media = replace(media, store=AssetStore(engine), engine=engine)
            rounds = housekeeper(kit_media, media.storage, batch=10)
            for outage, recovery in ((pg.stop, pg.start), (pg.freeze, pg.thaw)):
                outage()
                try:
                    started = time.monotonic()
                    with pytest.raises(DatabaseFailed):
                        await rounds.backfill_thumbnails(media.clock.now)
                    assert time.monotonic() - started < 10
                finally:
                    recovery()
            done = await rounds.backfill_thumbnails(media.clock.now)
            assert (done.made, done.failed) == (1, 0)
            assert await backfill_columns(kit_media, asset_id) == ("image/webp", None)
            assert await media.storage.stat(thumbnail_key(key)) is not None
        finally:
            await engine.dispose()
