"""The first state of WatchJob streams, read in batches: streams that open at about the
same time (a reconnect storm after a replica restarts) share one query instead of each
taking a pooled connection, which thousands at once would wait on until they time out."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.notify.streams.change import Change

ReadMany = Callable[[list[str]], Awaitable[dict[str, Change]]]
# Job ids per query (one array parameter; the primary key answers each).
MAX_BATCH = 1000


class FirstStates:
    """``get(job_id)`` joins the next batch. The first caller starts a query at once;
    whoever arrives while it runs goes into the next one, so nothing waits on a timer."""

    def __init__(self, read_many: ReadMany) -> None:
        self._read_many = read_many
        self._waiting: dict[str, list[asyncio.Future[Change | None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def get(self, job_id: str) -> Change | None:
        future: asyncio.Future[Change | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, []).append(future)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="first-states")
        return await future

    async def _read(self) -> None:
        while self._waiting:
            job_ids = list(self._waiting)[:MAX_BATCH]
            batch = {job_id: self._waiting.pop(job_id) for job_id in job_ids}
            try:
                found = await self._read_many(job_ids)
            except Exception as error:
                # Each stream answers the failure itself (an outage is UNAVAILABLE).
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                continue
            for job_id, futures in batch.items():
                for future in futures:
                    if not future.done():
                        future.set_result(found.get(job_id))
