"""media's thumbnail maker: a background component that gives every ready output its
preview, off the job's path. A job is SUCCEEDED as soon as its outputs are committed;
the thumbnail follows within moments, and its URL is handed out from then on.

The queue is the assets table itself: ready outputs with neither a thumbnail nor a
recorded failure, claimed a few at a time with ``SKIP LOCKED`` (thumbnail_backfill.py),
so any number of media replicas share the work and one that dies mid-round leaves its
claims to go stale and be taken again. An output committed on this replica wakes the
maker, which lets the outputs committed in the next GATHER_SECONDS join the same round;
outputs committed elsewhere are found by the next poll, ``idle_seconds`` later at most.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.kit.logging import get_logger
from services.media.assets import Clock
from services.media.errors import MediaError
from services.media.thumbnail_backfill import ThumbnailBackfill

log = get_logger(__name__)

# What a failure of our own costs before the next round: not a busy loop.
PAUSE_AFTER_FAILURE_SECONDS = 1.0
# After a wake-up, how long outputs committed meanwhile are let in before the round
# claims: a round costs a claim and a record statement whether it takes one output or
# twenty, and commits arrive one by one.
GATHER_SECONDS = 0.05


class ThumbnailQueue:
    def __init__(self, backfill: ThumbnailBackfill, clock: Clock, idle_seconds: float) -> None:
        self._backfill = backfill
        self._clock = clock
        self._idle_seconds = idle_seconds
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """An output became ready on this replica: take it now, not at the next poll."""
        self._wake.set()

    async def make_thumbnails(self) -> None:
        """The background task: rounds until the queue is empty, then a wait for a wake-up
        or the poll. A dependency down is one line and a pause, never the end of it."""
        if self._backfill.batch == 0:
            # Thumbnails are off (ATELIER_MEDIA_THUMBNAIL_BACKFILL_BATCH=0): nothing to do
            # until stopped (a component that ends is a failure).
            await asyncio.Event().wait()
        while True:
            self._wake.clear()
            try:
                done = await self._backfill.run(self._clock())
            except MediaError as failure:
                log.warning("thumbnails_postponed", error=type(failure).__name__)
                await asyncio.sleep(PAUSE_AFTER_FAILURE_SECONDS)
                continue
            except Exception:
                log.exception("thumbnails_failed")
                await asyncio.sleep(PAUSE_AFTER_FAILURE_SECONDS)
                continue
            if done.taken >= self._backfill.batch:
                continue  # a full round: more may be waiting
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._idle_seconds)
                await asyncio.sleep(GATHER_SECONDS)
