"""The worker: claims due jobs in batches (priority, next attempt, age) as slots free up,
runs each as an attempt, and owns the lease keeper that holds them. A NOTIFY on
``creation_jobs`` (a trigger sends it whenever a job becomes queued) wakes it; a poll is
the fallback for what no notification announces (a retry whose backoff ended, a
notification lost while the LISTEN connection was down).

Stopping is a drain: no more claims, running attempts reach a safe point within the
deadline while their leases keep beating, and what cannot finish is handed back (queued,
request id kept) for the next worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job
from services.creation.media_client import MediaClient
from services.creation.object_transfer import ObjectTransfer
from services.creation.providers.base import Provider
from services.creation.providers.limits import ProviderLimits
from services.creation.settings import CreationSettings, WorkerSettings
from services.creation.store import leases
from services.creation.store.leases import QUEUED_CHANNEL
from services.creation.worker.attempt import Attempt
from services.creation.worker.context import AttemptContext, Drain, PointHook, no_point
from services.creation.worker.fenced_writer import FencedWriter
from services.creation.worker.lease_keeper import LeaseKeeper
from services.kit.clock import Clock, system_clock
from services.kit.listen import Listener
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

# After a claim fails (the database is away), wait this long before the next.
CLAIM_RETRY_SECONDS = 1.0
# The part of the drain window kept for handing jobs back after attempts stop polling.
HAND_BACK_MARGIN_SECONDS = 1.0


def _direct_objects(settings: WorkerSettings) -> tuple[str, str] | None:
    if not settings.object_direct_base_url:
        return None
    return settings.object_public_base_url, settings.object_direct_base_url


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """A component (``run``/``stop``) running at most ``settings.worker.concurrency``
    attempts at once."""

    name = "worker"

    def __init__(
        self,
        engine: AsyncEngine,
        media: MediaClient,
        providers: Mapping[str, Provider],
        settings: CreationSettings,
        *,
        clock: Clock = system_clock,
        on_point: PointHook = no_point,
        worker_id: str | None = None,
    ) -> None:
        self.worker_id = worker_id or new_worker_id()
        self._engine = engine
        self._settings = settings
        self._config = settings.worker
        self._clock = clock
        self._ttl = timedelta(seconds=settings.lease_ttl_seconds)
        self.keeper = LeaseKeeper(
            engine,
            self.worker_id,
            self._ttl,
            settings.heartbeat_seconds,
            clock,
            progress_seconds=settings.progress_seconds,
        )
        self.listener = Listener(settings.common.database_url, QUEUED_CHANNEL)
        self._drain = Drain()
        self.context = AttemptContext(
            engine=engine,
            media=media,
            providers=providers,
            settings=settings,
            clock=clock,
            drain=self._drain,
            writer=FencedWriter(engine, clock),
            on_point=on_point,
            limits=ProviderLimits(settings.providers.limits),
            transfer=ObjectTransfer(
                ca_file=settings.worker.object_ca_file, direct=_direct_objects(settings.worker)
            ),
        )
        self._attempts: set[asyncio.Task[str]] = set()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._drain_until: float | None = None
        self._log = Throttle()
        self.claim_rounds = 0  # claim statements sent, for tests and metrics

    @property
    def running(self) -> int:
        """Attempts running now."""
        return len(self._attempts)

    async def run(self) -> None:
        helpers = [
            asyncio.create_task(self.keeper.run(), name="lease-keeper"),
            asyncio.create_task(self.listener.run(), name=self.listener.name),
        ]
        log.info("worker_started", worker_id=self.worker_id, concurrency=self._config.concurrency)
        try:
            await self._claim_until_stopped(helpers)
            await self._finish_attempts()
        finally:
            for attempt in self._attempts:
                attempt.cancel()  # only when the loop itself failed: leave nothing running
            await asyncio.gather(*self._attempts, return_exceptions=True)
            self.keeper.stop()
            await self.listener.stop(0)
            await asyncio.gather(*helpers, return_exceptions=True)
            await self.context.transfer.close()
            log.info("worker_stopped", worker_id=self.worker_id)

    async def stop(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        until = min(deadline, loop.time() + self._config.drain_seconds)
        margin = min(HAND_BACK_MARGIN_SECONDS, max(0.0, until - loop.time()) / 4)
        self._drain_until = until
        self._drain.begin(until - margin)
        self._stopping.set()

    # --- claiming ---------------------------------------------------------------------

    async def _claim_until_stopped(self, helpers: list[asyncio.Task[None]]) -> None:
        while not self._stopping.is_set():
            for helper in helpers:
                if helper.done():
                    # A helper that ends on its own takes the worker down with it.
                    helper.result()
                    raise RuntimeError(f"{helper.get_name()} ended on its own")
            free = self._config.concurrency - len(self._attempts)
            wanted = min(free, self._config.claim_batch)
            claimed = await self._claim(wanted) if wanted > 0 else []
            if wanted > 0 and len(claimed) == wanted:
                continue  # there may be more due right now
            await self._wait_for_work(helpers)

    async def _claim(self, limit: int) -> list[Job]:
        self.claim_rounds += 1
        try:
            claimed = await leases.claim(
                self._engine, self.worker_id, limit, self._ttl, self._clock()
            )
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            if self._log.admit(f"claim:{outage.kind}") is not None:
                log.warning("claim_failed", worker_id=self.worker_id, error=outage.kind)
            await self._sleep(CLAIM_RETRY_SECONDS)
            return []
        for job in claimed:
            self._start(job)
        if claimed:
            # One line per claim, not per job: attempt_ended tells each job's story.
            log.info(
                "jobs_claimed",
                worker_id=self.worker_id,
                job_ids=[job.job_id for job in claimed],
            )
        return claimed

    def _start(self, job: Job) -> None:
        lease = self.keeper.hold(job)
        attempt = Attempt(job, lease, self.context)
        task = asyncio.create_task(attempt.run(), name=f"attempt:{job.job_id}")
        lease.task = task
        self._attempts.add(task)

        def ended(done: asyncio.Task[str]) -> None:
            self._attempts.discard(done)
            self.keeper.release(lease)
            self._slot_freed.set()

        task.add_done_callback(ended)

    async def _wait_for_work(self, helpers: list[asyncio.Task[None]]) -> None:
        self._slot_freed.clear()
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._stopping.wait())]
        if len(self._attempts) >= self._config.concurrency:
            waiters.append(asyncio.ensure_future(self._slot_freed.wait()))
        else:
            waiters.append(asyncio.ensure_future(self.listener.woken(self._config.poll_seconds)))
        try:
            await asyncio.wait([*waiters, *helpers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # --- draining ---------------------------------------------------------------------

    async def _finish_attempts(self) -> None:
        if not self._attempts:
            return
        loop = asyncio.get_running_loop()
        until = self._drain_until if self._drain_until is not None else loop.time()
        log.info("worker_draining", worker_id=self.worker_id, running=len(self._attempts))
        _, late = await asyncio.wait(set(self._attempts), timeout=max(0.0, until - loop.time()))
        for task in late:
            # Past the deadline (a provider call that would not return): its lease expires
            # and the reaper decides by its step.
            log.warning("attempt_abandoned", task=task.get_name())
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
