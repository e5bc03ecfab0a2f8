"""Per-provider limits of one worker process, shared by all its attempts.

Two limits per provider code (settings: ATELIER_<CODE>_MAX_IN_FLIGHT, _RATE, _BURST):

- a **concurrency cap**: an attempt holds a slot from before its submit (or, resuming a
  job that has a request, before its first poll) until polling ends, so at most
  ``max_in_flight`` requests of this process are live at the provider;
- a **token bucket** on submits: a burst of claimed jobs reaches the provider at
  ``rate_per_second`` (after ``burst`` at once), never faster, so our own burst does not
  trip the provider's 429s. Polls are not metered: the cap and the poll period bound them.

Waiting is interruptible: the attempt passes the events that must stop the wait (its
owner's cancel, the worker's drain), and ``acquire`` returns False when one fired. A job
waiting here keeps its lease: the lease keeper beats every job the process holds,
whatever the attempt is doing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

from services.creation.settings import ProviderLimit


class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``; a taker waits its turn in
    arrival order."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def wait_seconds(self) -> float:
        """How long until a token is there (0: one is there now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self._rate

    async def take(self) -> None:
        async with self._lock:  # first come, first served
            while True:
                delay = self.wait_seconds()
                if delay <= 0:
                    self._tokens -= 1
                    return
                await asyncio.sleep(delay)  # the bucket refills with time, nothing else


class ProviderGate:
    """One provider code's slots and submit bucket in this process."""

    def __init__(self, limit: ProviderLimit) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit.max_in_flight) if limit.max_in_flight else None
        self._bucket = (
            TokenBucket(limit.rate_per_second, limit.burst) if limit.rate_per_second else None
        )
        self.in_flight = 0
        self.peak_in_flight = 0  # for tests and metrics
        self.waiting = 0

    async def _until(self, work: asyncio.Future[Any], stops: Sequence[asyncio.Event]) -> bool:
        """Waits for ``work`` unless a stop fires first; True when ``work`` finished."""
        stoppers: list[asyncio.Future[Any]] = [asyncio.ensure_future(s.wait()) for s in stops]
        try:
            await asyncio.wait([work, *stoppers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stopper in stoppers:
                stopper.cancel()
        if work.done() and not work.cancelled():
            work.result()
            return True
        work.cancel()
        with suppress(asyncio.CancelledError):
            await work
        return False

    async def acquire_slot(self, stops: Sequence[asyncio.Event]) -> bool:
        if self._slots is None:
            self._entered()
            return True
        self.waiting += 1
        try:
            if not await self._until(asyncio.ensure_future(self._slots.acquire()), stops):
                return False
        finally:
            self.waiting -= 1
        self._entered()
        return True

    def _entered(self) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def release_slot(self) -> None:
        self.in_flight -= 1
        if self._slots is not None:
            self._slots.release()

    async def submit_token(self, stops: Sequence[asyncio.Event]) -> bool:
        if self._bucket is None:
            return True
        return await self._until(asyncio.ensure_future(self._bucket.take()), stops)


class ProviderLimits:
    """Every provider code's gate in this process; a code with no limit set gets a gate
    that never waits (it still counts what is in flight)."""

    def __init__(self, limits: Mapping[str, ProviderLimit] | None = None) -> None:
        self._limits = dict(limits or {})
        self._gates: dict[str, ProviderGate] = {}

    def gate(self, code: str) -> ProviderGate:
        gate = self._gates.get(code)
        if gate is None:
            gate = ProviderGate(self._limits.get(code, ProviderLimit()))
            self._gates[code] = gate
        return gate

    @asynccontextmanager
    async def slot(self, code: str, stops: Sequence[asyncio.Event]) -> AsyncIterator[bool]:
        """Holds one of ``code``'s slots for the block; yields False (holding nothing)
        when a stop fired while waiting."""
        gate = self.gate(code)
        if not await gate.acquire_slot(stops):
            yield False
            return
        try:
            yield True
        finally:
            gate.release_slot()
