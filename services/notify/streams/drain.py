"""Ends every local stream on purpose when the process drains, so clients reconnect to
another replica instead of seeing a failure."""

from __future__ import annotations

import asyncio

from services.notify.streams.inbox import EndReason
from services.notify.streams.registry import StreamRegistry


class StreamDrain:
    """A component that does nothing until the process stops; then it sends every stream
    a StreamEnd (DRAINING) and waits, up to the deadline, for them to close."""

    name = "stream-drain"

    def __init__(self, registry: StreamRegistry) -> None:
        self._registry = registry
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        await self._stopped.wait()

    async def stop(self, deadline: float) -> None:
        self._registry.end_all(EndReason.DRAINING)
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(0.0, remaining)):
                await self._registry.wait_empty()
        except TimeoutError:
            pass  # the server's own stop(grace) cancels what is left
        finally:
            self._stopped.set()
