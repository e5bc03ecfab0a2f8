"""Removes uploads that were never completed within their expiry: the object goes, the
row is marked deleted.

Safe with any number of media replicas: each batch is claimed with ``FOR UPDATE SKIP
LOCKED``, so replicas take disjoint rows, and the row lock is held while the objects are
deleted and the rows marked, so a crash half-way leaves the rows to the next sweep rather
than a row that lies about its object.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

from services.kit.logging import get_logger
from services.media.assets import Clock, utc_now
from services.media.storage import ObjectStorage
from services.media.store import AssetStore

log = get_logger(__name__)


class Housekeeper:
    def __init__(
        self,
        store: AssetStore,
        storage: ObjectStorage,
        *,
        period_seconds: float,
        batch_size: int,
        clock: Clock = utc_now,
    ) -> None:
        self._store = store
        self._storage = storage
        self._period = period_seconds
        self._batch_size = batch_size
        self._clock = clock

    async def sweep(self, now: datetime | None = None) -> list[uuid.UUID]:
        """Removes every upload expired at ``now`` that no other replica is removing;
        returns the ids this call removed."""
        moment = self._clock() if now is None else now
        removed: list[uuid.UUID] = []
        while True:
            async with self._store.claim_expired_uploads(moment, self._batch_size) as batch:
                await asyncio.gather(*(self._storage.delete(u.object_key) for u in batch.uploads))
                await batch.mark_deleted()
            removed.extend(u.asset_id for u in batch.uploads)
            if len(batch.uploads) < self._batch_size:
                break
        if removed:
            log.info("expired_uploads_removed", count=len(removed))
        return removed

    async def housekeeping_loop(self) -> None:
        """The background task: a failed sweep is logged and tried again next period
        (a database restart must not stop media)."""
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("housekeeping_failed")
            await asyncio.sleep(self._period)
