"""What media cleans up after the fact, so that nothing a crash, a timeout or a late
client leaves behind stays forever:

- uploads never completed within their expiry: the object (and a thumbnail a put may have
  stored beside it) goes, the row is marked deleted;
- objects of deleted assets: a crash between marking a row deleted and removing its
  object, or a presigned S3 upload that arrives after the deletion, leaves one behind.
  A deleted asset stays watched until no upload URL of it can add an object any more
  (its upload expiry plus the abandoned-write age); then its object is removed for good;
- unfinished writes older than the abandoned-write age: the local backend's
  ``.incoming/*.part`` files, S3's incomplete multipart uploads. A write in progress is
  younger (a local write refreshes its file with every chunk), so it is never touched;
- given a backfill, outputs without a thumbnail get theirs, a bounded number per round
  (services/media/thumbnail_backfill.py; the service runs it as a component of its own,
  services/media/thumbnail_queue.py, so a preview follows its output within moments).

What S3 cannot do: a presigned URL cannot be revoked. Until its expiry, the holder of an
upload URL of a deleted asset can PUT an object again, and a download URL handed out
before the deletion then serves it; housekeeping removes it at its next sweep (within
one period), and once the upload URL has expired nothing can bring it back. The local
backend has no such window: its listener checks the asset's state on every request.

Safe with any number of media replicas: each batch is claimed with ``FOR UPDATE SKIP
LOCKED``, so replicas take disjoint rows, and the row lock is held while the objects are
deleted and the rows marked, so a crash half-way leaves the rows to the next sweep rather
than a row that lies about its object.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from services.kit.logging import get_logger
from services.media.assets import Clock, utc_now
from services.media.domain import thumbnail_key
from services.media.errors import MediaError
from services.media.storage import ObjectStorage
from services.media.store.assets import AssetStore
from services.media.thumbnail_backfill import BackfillRound, ThumbnailBackfill

log = get_logger(__name__)

DEFAULT_ABANDONED_WRITE_AGE = timedelta(hours=1)


@dataclass(frozen=True)
class Purge:
    # Objects of deleted assets that were still (or again) there, now removed.
    objects_removed: int
    # Deleted assets no longer watched: their objects are gone for good.
    settled: int


def _keys(asset_object_key: str) -> tuple[str, str]:
    """Every object an asset may have: its bytes and its thumbnail (derived keys, so a
    crash between storing one and recording it leaves nothing unfound)."""
    return asset_object_key, thumbnail_key(asset_object_key)


class Housekeeper:
    def __init__(
        self,
        store: AssetStore,
        storage: ObjectStorage,
        *,
        period_seconds: float,
        batch_size: int,
        abandoned_write_age: timedelta = DEFAULT_ABANDONED_WRITE_AGE,
        clock: Clock = utc_now,
        backfill: ThumbnailBackfill | None = None,
    ) -> None:
        """``backfill``: makes the thumbnails old outputs lack (None: none are made)."""
        self._store = store
        self._storage = storage
        self._period = period_seconds
        self._batch_size = batch_size
        self._abandoned_write_age = abandoned_write_age
        self._clock = clock
        self._backfill = backfill

    async def sweep(self, now: datetime | None = None) -> list[uuid.UUID]:
        """One round of every cleanup; returns the ids of the expired uploads it removed."""
        moment = self._clock() if now is None else now
        removed = await self.remove_expired_uploads(moment)
        await self.purge_deleted(moment)
        await self.remove_abandoned_writes(moment)
        await self.backfill_thumbnails(moment)
        return removed

    async def remove_expired_uploads(self, now: datetime) -> list[uuid.UUID]:
        """Removes every upload expired at ``now`` that no other replica is removing;
        returns the ids this call removed."""
        removed: list[uuid.UUID] = []
        while True:
            async with self._store.claim_expired_uploads(now, self._batch_size) as batch:
                keys = [key for u in batch.uploads for key in _keys(u.object_key)]
                await asyncio.gather(*(self._storage.delete(key) for key in keys))
                await batch.mark_deleted()
            removed.extend(u.asset_id for u in batch.uploads)
            if len(batch.uploads) < self._batch_size:
                break
        if removed:
            log.info("expired_uploads_removed", count=len(removed))
        return removed

    async def purge_deleted(self, now: datetime) -> Purge:
        """Removes the objects of deleted assets, one batch of rows at a time, each row
        once per sweep; settles the rows no URL can add an object to any more."""
        removed = settled = 0
        after: uuid.UUID | None = None
        while True:
            async with self._store.claim_unpurged(
                after, self._batch_size, now, self._abandoned_write_age
            ) as batch:
                keys = [key for a in batch.assets for key in _keys(a.object_key)]
                found = await asyncio.gather(*(self._remove_if_present(key) for key in keys))
                done = [a.asset_id for a in batch.assets if a.settled]
                await batch.mark_purged(done)
            removed += sum(found)
            settled += len(done)
            if len(batch.assets) < self._batch_size:
                break
            after = batch.assets[-1].asset_id
        if removed:
            # Worth a look: each is a crash's leftover or an upload after a deletion.
            log.warning("deleted_assets_objects_removed", count=removed)
        return Purge(removed, settled)

    async def _remove_if_present(self, key: str) -> bool:
        if await self._storage.stat(key) is None:
            return False
        await self._storage.delete(key)
        return True

    async def remove_abandoned_writes(self, now: datetime) -> int:
        """Removes unfinished writes untouched for the abandoned-write age, a batch at a
        time; returns how many."""
        older_than = now - self._abandoned_write_age
        total = 0
        while True:
            count = await self._storage.remove_abandoned_writes(older_than, self._batch_size)
            total += count
            if count < self._batch_size:
                break
        if total:
            log.info("abandoned_writes_removed", count=total)
        return total

    async def backfill_thumbnails(self, now: datetime) -> BackfillRound:
        """Thumbnails for up to a batch of outputs stored without one."""
        if self._backfill is None:
            return BackfillRound(made=0, failed=0)
        return await self._backfill.run(now)

    async def housekeeping_loop(self) -> None:
        """The background task: each cleanup runs on its own, so one whose dependency is
        down (the database, the object store) does not hold up the others; a failure is
        logged and tried again next period (a database restart must not stop media)."""
        passes = (
            self.remove_expired_uploads,
            self.purge_deleted,
            self.remove_abandoned_writes,
            self.backfill_thumbnails,
        )
        while True:
            now = self._clock()
            for cleanup in passes:
                try:
                    await cleanup(now)
                except MediaError as failure:
                    # A dependency is down (said once a period, without a trace).
                    log.warning(
                        "housekeeping_postponed",
                        cleanup=cleanup.__name__,
                        error=type(failure).__name__,
                    )
                except Exception:
                    log.exception("housekeeping_failed", cleanup=cleanup.__name__)
            await asyncio.sleep(self._period)
