"""Thumbnails for ready outputs that have none: every output committed since thumbnails
left the job's path (media makes them in the background, thumbnail_queue.py runs the
rounds), and those stored before media made them at all (migration 0005). Each round
takes at most ``batch`` outputs (0: off), a few at a time.

Claiming stamps ``thumbnail_claimed_at`` in one statement (its row locks taken with SKIP
LOCKED and released at once): replicas take disjoint rows, and no row lock or pooled
connection is held while an image is read and decoded (a DeleteAsset waiting on such a
lock would run into the lock timeout). A claim older than ``stale_after`` (a replica
that died mid-batch) is taken again.

Idempotent: the thumbnail's key is derived, so a crash between storing it and recording
it leaves bytes that the next attempt finds (ObjectExists) and records — the same image
made them. An object that is gone or that Pillow cannot read is marked with why
(``thumbnail_failure``) and never tried again; one bad object never fails the round.
The database or the storage down: the round hands back what it had claimed and raises,
and the housekeeping loop logs one line and tries again next period.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import Counter

from services.kit.logging import get_logger
from services.media.domain import thumbnail_key
from services.media.errors import ContentRejected, DatabaseFailed, StorageUnavailable
from services.media.spool import Spooled, SpoolLimitExceeded, spool
from services.media.storage import ObjectExists, ObjectNotFound, ObjectStorage, WholeObject
from services.media.store.assets import AssetStore, ThumbnailWanted
from services.media.thumbnails import Thumbnail, Thumbnailer

log = get_logger(__name__)

# Why no thumbnail can be made (media.assets.thumbnail_failure).
OBJECT_MISSING = "object_missing"
NOT_DECODABLE = "not_decodable"

# Claimed at once: a few images' work, far inside the stale age.
CLAIM_CHUNK = 32
DEFAULT_STALE_AFTER = timedelta(minutes=10)
# Objects up to this size are read into memory; larger ones into a temporary file.
_SPOOL_MEMORY_BYTES = 1024 * 1024

BACKFILLED = Counter(
    "atelier_media_thumbnails_backfilled",
    "Outputs the thumbnail backfill took, by outcome: made, object_missing, not_decodable, "
    "asset_gone (deleted meanwhile), error (left to be taken again)",
    ["outcome"],
)


@dataclass(frozen=True)
class BackfillRound:
    made: int
    # Marked: gone or not decodable, never tried again.
    failed: int
    # Claimed in all (a full round: more may be waiting).
    taken: int = 0


@dataclass(frozen=True)
class _Stored:
    """A thumbnail stored under its derived key, not yet recorded."""

    wanted: ThumbnailWanted
    content_type: str


class ThumbnailBackfill:
    def __init__(
        self,
        store: AssetStore,
        storage: ObjectStorage,
        thumbnailer: Thumbnailer,
        *,
        batch: int,
        chunk_bytes: int,
        stale_after: timedelta = DEFAULT_STALE_AFTER,
    ) -> None:
        self._store = store
        self._storage = storage
        self._thumbnailer = thumbnailer
        self._batch = batch
        self._chunk_bytes = chunk_bytes
        self._stale_after = stale_after

    async def run(self, now: datetime) -> BackfillRound:
        """One round: up to ``batch`` outputs, claimed a few at a time; the thumbnails of
        a claimed chunk are recorded together, in one statement."""
        outcomes: list[str] = []
        taken = 0
        while taken < self._batch:
            limit = min(CLAIM_CHUNK, self._batch - taken)
            claimed = await self._store.claim_thumbnail_backlog(now, now - self._stale_after, limit)
            taken += len(claimed)
            stored: list[_Stored] = []
            for index, wanted in enumerate(claimed):
                try:
                    outcome = await self._backfill(wanted)
                except (DatabaseFailed, StorageUnavailable):
                    # What was stored is recorded if it can be; the rest goes back.
                    with contextlib.suppress(DatabaseFailed):
                        outcomes += await self._record(stored)
                        stored = []
                    await self._release([s.wanted for s in stored] + claimed[index:], now)
                    raise
                except Exception:
                    # A bug, not the object: left claimed, taken again once stale.
                    log.exception("thumbnail_backfill_failed", asset_id=str(wanted.asset_id))
                    outcome = "error"
                if isinstance(outcome, _Stored):
                    stored.append(outcome)
                else:
                    BACKFILLED.labels(outcome).inc()
                    outcomes.append(outcome)
            try:
                outcomes += await self._record(stored)
            except DatabaseFailed:
                await self._release([s.wanted for s in stored], now)
                raise
            if len(claimed) < limit:
                break
        done = BackfillRound(
            made=outcomes.count("made"),
            failed=outcomes.count(OBJECT_MISSING) + outcomes.count(NOT_DECODABLE),
            taken=taken,
        )
        if done.failed:
            log.info("thumbnails_backfilled", made=done.made, failed=done.failed)
        return done

    async def _record(self, stored: list[_Stored]) -> list[str]:
        """Records stored thumbnails; one of an asset deleted meanwhile is removed (its
        purge may be over already). The outcomes."""
        recorded = await self._store.record_thumbnails(
            [(s.wanted.asset_id, s.content_type) for s in stored]
        )
        outcomes = []
        for done in stored:
            if done.wanted.asset_id in recorded:
                outcome = "made"
            else:
                await self._storage.delete(thumbnail_key(done.wanted.object_key))
                outcome = "asset_gone"
            BACKFILLED.labels(outcome).inc()
            outcomes.append(outcome)
        return outcomes

    @property
    def batch(self) -> int:
        return self._batch

    async def _release(self, claimed: list[ThumbnailWanted], now: datetime) -> None:
        # Best effort: with the database down too, the claims simply go stale.
        with contextlib.suppress(DatabaseFailed):
            await self._store.release_thumbnail_claims([w.asset_id for w in claimed], now)

    async def _backfill(self, wanted: ThumbnailWanted) -> _Stored | str:
        """Makes and stores one thumbnail (recorded by the caller), or records why none
        can be made and returns that outcome."""
        thumbnail = await self._make(wanted)
        if isinstance(thumbnail, str):
            await self._store.mark_thumbnail_failed(wanted.asset_id, thumbnail)
            log.warning(
                "thumbnail_backfill_refused", asset_id=str(wanted.asset_id), failure=thumbnail
            )
            return thumbnail
        key = thumbnail_key(wanted.object_key)
        # Found: an earlier attempt stored it and died before recording it.
        with contextlib.suppress(ObjectExists):
            await self._storage.put(
                key, WholeObject(thumbnail.data, self._chunk_bytes), thumbnail.content_type
            )
        return _Stored(wanted, thumbnail.content_type)

    async def _make(self, wanted: ThumbnailWanted) -> Thumbnail | str:
        """The thumbnail of the asset's object, or why none can be made."""
        try:
            spooled: Spooled = await spool(
                self._storage.stream(wanted.object_key, self._chunk_bytes),
                # A ready asset's object is exactly as large as measured.
                max_bytes=wanted.size_bytes,
                memory_bytes=max(self._chunk_bytes, _SPOOL_MEMORY_BYTES),
            )
        except ObjectNotFound:
            return OBJECT_MISSING
        except SpoolLimitExceeded:
            return NOT_DECODABLE
        try:
            return await self._thumbnailer.make(spooled.file, wanted.content_type)
        except ContentRejected:
            return NOT_DECODABLE
        finally:
            spooled.close()
