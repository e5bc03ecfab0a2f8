"""Deletes outputs that no job will show: those an attempt landed in media before it
ended without success (failed, cancelled — while running or while queued to resume —,
or retried afresh).

Why by idempotency key and through a list in the database: outputs are landed under keys
made of the job, the attempt and the output's index, so a worker killed after landing
and the worker that resumes the attempt land onto the same assets (nothing to clean up
when it succeeds). When the attempt ends otherwise, a trigger lists it in that change's
own transaction, so no kill point between landing, ending and deleting loses track of
it: the worker that ended the attempt deletes at once, and the reaper sweeps what a
crash left listed (and what an owner's cancel of a queued job listed). media keeps a
deleted asset's key, so a stale worker landing late cannot bring one back either."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.media_client import MediaClient
from services.creation.store import output_purges
from services.kit.logging import get_logger

log = get_logger(__name__)

BATCH = 50


async def purge(
    engine: AsyncEngine, media: MediaClient, *, job_id: str | None = None, limit: int = BATCH
) -> int:
    """Deletes the listed outputs (of one job, when given) through media; how many
    attempts it purged. Raises when media or the database does not answer: the list
    stays for a later sweep."""
    async with output_purges.claim(engine, limit, job_id) as purges:
        for item in purges:
            deleted = await media.delete_keyed_assets(item.user_id, item.keys)
            log.info("outputs_purged", job_id=item.job_id, attempt=item.attempt, deleted=deleted)
    return len(purges)


async def sweep(engine: AsyncEngine, media: MediaClient, limit: int = BATCH) -> int:
    """Purges everything listed, a batch per transaction; how many attempts."""
    total = 0
    while True:
        done = await purge(engine, media, limit=limit)
        total += done
        if done < limit:
            return total
