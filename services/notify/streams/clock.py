"""One clock for every local stream: it owes a silent stream a keep-alive and ends a
stream at its maximum duration. A timer per stream would cost each message a timer set
and cancelled; this walks the streams once per tick."""

from __future__ import annotations

import asyncio

from services.notify.streams.inbox import EndReason
from services.notify.streams.registry import StreamRegistry


class StreamClock:
    """A component: every ``tick`` seconds, nudges the streams silent for
    ``keep_alive`` seconds and ends those past their deadline."""

    name = "stream-clock"

    def __init__(self, registry: StreamRegistry, keep_alive: float) -> None:
        self._registry = registry
        self._keep_alive = keep_alive
        # Keep-alives go out between keep_alive and keep_alive + tick after the last send.
        self.tick = min(1.0, keep_alive / 4)
        self._stopped = asyncio.Event()

    def sweep(self, now: float) -> None:
        silent_since = now - self._keep_alive
        for inbox in self._registry.inboxes():
            if now >= inbox.deadline:
                inbox.end(EndReason.MAX_DURATION)
            elif inbox.last_sent <= silent_since and not inbox.keep_alive_due:
                inbox.nudge()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped.is_set():
            self.sweep(loop.time())
            try:
                await asyncio.wait_for(self._stopped.wait(), self.tick)
            except TimeoutError:
                continue

    async def stop(self, deadline: float) -> None:
        self._stopped.set()
