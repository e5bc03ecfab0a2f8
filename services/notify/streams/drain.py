"""Ends every local stream on purpose when the process drains, so clients reconnect to
another replica instead of seeing a failure."""

from __future__ import annotations

import asyncio

from services.notify.streams.inbox import EndReason
from services.notify.streams.registry import StreamRegistry


class StreamDrain:
    """A component that waits for the process to stop; then every stream gets a StreamEnd
    (DRAINING), and ``run`` returns once they have all closed (the supervisor cancels it
    at the deadline, and the servers' own stop(grace) ends what is left)."""

    name = "stream-drain"

    def __init__(self, registry: StreamRegistry) -> None:
        self._registry = registry
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        await self._stopping.wait()
        await self._registry.wait_empty()

    async def stop(self, deadline: float) -> None:
        self._registry.end_all(EndReason.DRAINING)
        self._stopping.set()
