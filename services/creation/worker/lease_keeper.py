"""Keeps the leases of every attempt this process runs: one statement per beat for all of
them (never one per job), carrying only the newest progress of each, and reading the
owners' cancel requests.

Progress has its own, shorter interval (a screen wants it every second or two, a lease
only every few): between full beats, a progress beat sends only the attempts whose
progress changed, still in one statement. Either way a job gets at most one progress
version per progress interval, and only when its progress changed.

Fails closed: a job the beat no longer matches was taken over, so its attempt is cancelled
at once and writes nothing more; and when beats keep failing for as long as a lease lasts,
every lease may have been reaped, so every attempt is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job
from services.creation.store import leases
from services.creation.store.leases import Beat
from services.kit.clock import Clock
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

LEASES_LOST = Counter(
    "atelier_worker_leases_lost",
    "Attempts this worker stopped because it no longer held their lease: taken_over (a beat "
    "found the job leased to someone else, most often after the reaper saw it expire) or "
    "abandoned (beats failed for as long as a lease lasts)",
    ["why"],
)
_TAKEN_OVER = LEASES_LOST.labels("taken_over")
_ABANDONED = LEASES_LOST.labels("abandoned")


class Lease:
    """One running attempt's hold on its job, as the attempt and the keeper share it."""

    def __init__(self, job: Job) -> None:
        self.job_id = job.job_id
        self.lease_epoch = job.lease_epoch
        self.cancel_requested = asyncio.Event()
        if job.cancel_requested:
            self.cancel_requested.set()
        self.lost = False
        # The attempt's own write ended the job (cancelled, failed, succeeded): the lease
        # is gone from the database by the attempt's doing, not taken over, and what the
        # attempt still does for it (its outputs' purge) must not be cancelled.
        self.ended = False
        self.task: asyncio.Task[Any] | None = None
        self._progress: int | None = None  # the newest not yet written
        self._writing = 0

    def report(self, progress: int) -> None:
        """Coalesced: only the newest value reaches the next beat."""
        self._progress = max(0, min(100, progress))

    @property
    def has_progress(self) -> bool:
        return self._progress is not None

    def take_progress(self) -> int | None:
        progress, self._progress = self._progress, None
        return progress

    def restore_progress(self, progress: int | None) -> None:
        if self._progress is None:
            self._progress = progress

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """Around a fenced write: the keeper does not cancel the attempt in the middle of
        one (the write's own fence says whether it still held the lease)."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
            if self.lost and self._writing == 0:
                self._cancel_task()

    def lose(self) -> None:
        self.lost = True
        if self._writing == 0:
            self._cancel_task()

    def _cancel_task(self) -> None:
        current = asyncio.current_task()
        if self.task is not None and self.task is not current and not self.task.done():
            self.task.cancel()


class LeaseKeeper:
    """Beats every ``beat_seconds`` until stopped; the worker that owns it stops it only
    after its attempts have ended, so leases keep beating while they drain."""

    def __init__(
        self,
        engine: AsyncEngine,
        worker_id: str,
        lease_ttl: timedelta,
        beat_seconds: float,
        clock: Clock,
        progress_seconds: float | None = None,
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._ttl = lease_ttl
        self._beat_seconds = beat_seconds
        self._progress_seconds = min(progress_seconds or beat_seconds, beat_seconds)
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._stopping = asyncio.Event()
        self._last_held: datetime | None = None
        self._log = Throttle()
        self.beats = 0  # completed full beats, for tests and metrics
        self.progress_beats = 0  # completed beats of new progress only

    def hold(self, job: Job) -> Lease:
        lease = Lease(job)
        if not self._leases:
            self._last_held = self._clock()  # the claim itself set the lease
        self._leases[job.job_id] = lease
        return lease

    def release(self, lease: Lease) -> None:
        if self._leases.get(lease.job_id) is lease:
            del self._leases[lease.job_id]

    @property
    def held(self) -> int:
        return len(self._leases)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self._beat_seconds
        while not self._stopping.is_set():
            wait = min(self._progress_seconds, max(0.0, next_beat - loop.time()))
            try:
                await asyncio.wait_for(self._stopping.wait(), wait)
            except TimeoutError:
                if loop.time() >= next_beat:
                    next_beat = loop.time() + self._beat_seconds
                    await self.beat()
                else:
                    await self.beat(progress_only=True)

    def stop(self) -> None:
        self._stopping.set()

    async def beat(self, *, progress_only: bool = False) -> None:
        """Beats every held lease, or with ``progress_only`` those with new progress."""
        held = list(self._leases.values())
        if progress_only:
            held = [lease for lease in held if lease.has_progress]
        if not held:
            return
        beats = [Beat(h.job_id, h.lease_epoch, h.take_progress()) for h in held]
        now = self._clock()
        try:
            result = await leases.beat(self._engine, self._worker_id, beats, self._ttl, now)
        except Exception as error:
            if classify(error) is None:
                raise
            for lease, sent in zip(held, beats, strict=True):
                lease.restore_progress(sent.progress)
            self._failed(type(error).__name__, now)
            return
        if progress_only:
            self.progress_beats += 1
        else:
            self._last_held = now
            self.beats += 1
        for lease in held:
            if self._leases.get(lease.job_id) is not lease:
                continue  # the attempt ended while the beat was on its way
            if lease.job_id not in result.held:
                if lease.ended:
                    self.release(lease)
                    continue
                log.warning("lease_lost", job_id=lease.job_id, lease_epoch=lease.lease_epoch)
                _TAKEN_OVER.inc()
                self.release(lease)
                lease.lose()
            elif result.held[lease.job_id]:
                lease.cancel_requested.set()

    def _failed(self, kind: str, now: datetime) -> None:
        if self._log.admit(f"beat:{kind}") is not None:
            log.warning("lease_beat_failed", error=kind, held=len(self._leases))
        if self._last_held is not None and now - self._last_held >= self._ttl:
            # Nobody can tell whether our leases still hold: stop before a new owner works
            # on the same jobs.
            log.error("leases_abandoned", held=len(self._leases))
            for lease in list(self._leases.values()):
                self.release(lease)
                lease.lose()
                _ABANDONED.inc()
