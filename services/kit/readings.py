"""Gauges read from the database on a timer, as a component of the process.

A scrape of /metrics never touches the database: it shows what the last reading set. A
reading is one statement on a timer, with a deadline; if the database is down or slow the
gauges keep their last values and two gauges of the reading itself say so: whether the
last reading succeeded and when one last did. Alerts on the read values must also look at
those (a stale queue depth is not an empty queue).

A reading that overruns its deadline is left to finish on its own rather than cancelled
(a cancelled database call may itself wait on a server that does not answer); the next
round starts a new reading only once that one has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import Counter, Gauge

from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

READING_OK = Gauge(
    "atelier_reading_ok",
    "1 if the last reading of database-derived gauges succeeded, 0 if it failed (the "
    "gauges then keep their last values)",
    ["reading"],
)
READING_TIMESTAMP = Gauge(
    "atelier_reading_last_success_timestamp_seconds",
    "Unix time of the last successful reading of database-derived gauges",
    ["reading"],
)
READING_FAILURES = Counter(
    "atelier_reading_failures",
    "Readings of database-derived gauges that failed, by kind (deadline, statement_timeout, "
    "unreachable, ..., error)",
    ["reading", "kind"],
)


class PeriodicReading:
    """Runs ``read`` (which sets its gauges) every ``period_seconds``, each within
    ``deadline_seconds``. ``name`` is the component's name and the ``reading`` label."""

    def __init__(
        self,
        name: str,
        read: Callable[[], Coroutine[Any, Any, None]],
        period_seconds: float,
        deadline_seconds: float,
    ) -> None:
        self.name = name
        self._read = read
        self._period = period_seconds
        self._deadline = deadline_seconds
        self._stopping = asyncio.Event()
        self._pending: asyncio.Task[None] | None = None
        self._log = Throttle()
        self._ok = READING_OK.labels(name)
        self._timestamp = READING_TIMESTAMP.labels(name)
        # Rounds ended, whatever their outcome; tests wait on it (see wait_rounds).
        self.rounds = 0
        self._round_ended = asyncio.Condition()

    async def run(self) -> None:
        while not self._stopping.is_set():
            await self.read_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._period)

    async def stop(self, deadline: float) -> None:
        self._stopping.set()
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()

    async def read_once(self) -> bool:
        """One round: True if the gauges now hold fresh values."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._read(), name=f"{self.name}:read")
            self._pending.add_done_callback(_retrieve)
        pending = self._pending
        await asyncio.wait({pending}, timeout=self._deadline)
        if not pending.done():
            fresh = self._failed("deadline")
        elif pending.cancelled():
            # Only stop() cancels a reading: the process is going away, nothing failed.
            fresh = False
        elif (error := pending.exception()) is not None:
            fresh = self._failed(self._kind(error))
        else:
            self._ok.set(1)
            self._timestamp.set(time.time())
            fresh = True
        async with self._round_ended:
            self.rounds += 1
            self._round_ended.notify_all()
        return fresh

    def _kind(self, error: BaseException) -> str:
        outage = classify(error)
        if outage is not None:
            return outage.kind
        # A broken reading must not stop the work of the process: the gauge of the
        # reading (and the alert on it) shows it, the log has the stack once per window.
        if self._log.admit(f"error:{type(error).__name__}") is not None:
            log.error(
                "reading_failed",
                reading=self.name,
                error="".join(traceback.format_exception(error)),
            )
        return "error"

    def _failed(self, kind: str) -> bool:
        self._ok.set(0)
        READING_FAILURES.labels(self.name, kind).inc()
        if kind != "error" and self._log.admit(kind) is not None:
            log.warning("reading_unavailable", reading=self.name, kind=kind)
        return False

    async def wait_rounds(self, count: int) -> None:
        """Returns once ``count`` more rounds have ended (for tests: two rounds after a
        change include one that started after it)."""
        async with self._round_ended:
            target = self.rounds + count
            await self._round_ended.wait_for(lambda: self.rounds >= target)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
