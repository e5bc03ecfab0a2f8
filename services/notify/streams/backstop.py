"""The backstop: every period, one batched read of the projection for everything this
replica's streams watch, and the streams get whatever they have not seen (Pub/Sub lost
it, Redis was away, or a change's cursor arrived out of order)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify, log_unavailable
from services.notify.streams.change import Change
from services.notify.streams.registry import StreamRegistry, Watched

log = get_logger(__name__)

ReadMissed = Callable[[Watched], Awaitable[Sequence[Change]]]


class Backstop:
    """A component: ``run`` polls every ``period`` seconds until ``stop``."""

    name = "stream-backstop"

    def __init__(self, registry: StreamRegistry, read_missed: ReadMissed, period: float) -> None:
        self._registry = registry
        self._read_missed = read_missed
        self._period = period
        self._throttle = Throttle()
        self._stopped = asyncio.Event()
        # Stream deliveries the backstop made (the fast path missed them): tests and logs.
        self.delivered = 0

    async def tick(self) -> int:
        """One pass; returns how many stream deliveries it made."""
        watched = self._registry.watched()
        if not watched.jobs and not watched.users:
            return 0
        changes = await self._read_missed(watched)
        taken = self._registry.dispatch(changes)
        self.delivered += taken
        if taken:
            log.info("backstop_delivered", deliveries=taken)
        return taken

    async def run(self) -> None:
        while not self._stopped.is_set():
            try:
                await self.tick()
            except Exception as error:
                outage = classify(error)
                if outage is None:
                    raise
                log_unavailable(self._throttle, outage.dependency, outage.kind, during="backstop")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._period)

    async def stop(self, deadline: float) -> None:
        self._stopped.set()
