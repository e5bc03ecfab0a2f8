"""Gathers the fenced writes this process's attempts ask for at the same moment into one
statement per kind (``leases.apply``): the jobs of a claimed batch reach SUBMITTING,
record their requests and complete together, one round trip each, instead of one per job.

A write waits for nothing but the event loop's current turn (and, under load, for the
statement of its kind already on its way): its batch is what was asked meanwhile, so a
lone attempt pays no delay and many pay one round trip. Each job keeps its own fence
inside the statement: a stale lease or a cancel request refuses that job alone, and its
attempt gets None exactly as from a write of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import leases
from services.creation.store.fenced import FencedItem, FencedWrite, Written
from services.kit.clock import Clock
from services.kit.outages import classify

# Writes waiting for their statement, by job id.
_Waiting = dict[str, tuple[FencedItem, "asyncio.Future[Written | None]"]]


@dataclass
class _Queue:
    waiting: _Waiting = field(default_factory=dict)
    sending: asyncio.Task[None] | None = None


class FencedWriter:
    """One per worker process. ``statements`` counts the statements sent (tests and
    metrics read it)."""

    def __init__(self, engine: AsyncEngine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock
        self._queues = {write: _Queue() for write in FencedWrite}
        self.statements = 0

    async def write(
        self, write: FencedWrite, job_id: str, lease_epoch: int, value: str | None = None
    ) -> Written | None:
        """The job's status and version as written, or None when its lease (or cancel
        request) refused it."""
        queue = self._queues[write]
        if job_id in queue.waiting:
            # One attempt per job, and an attempt awaits each write: a bug, never load.
            raise RuntimeError(f"two {write.name} writes waiting for job {job_id}")
        future: asyncio.Future[Written | None] = asyncio.get_running_loop().create_future()
        queue.waiting[job_id] = (FencedItem(job_id, lease_epoch, value), future)
        if queue.sending is None:
            queue.sending = asyncio.create_task(self._send(write, queue))
        return await future

    async def _send(self, write: FencedWrite, queue: _Queue) -> None:
        batch: _Waiting = {}
        try:
            while queue.waiting:
                # Let every attempt that runs in this turn of the loop join the batch.
                await asyncio.sleep(0)
                batch, queue.waiting = queue.waiting, {}
                await self._apply(write, batch)
        finally:
            # Cancelled with the worker: nobody waits forever.
            for _, future in [*batch.values(), *queue.waiting.values()]:
                future.cancel()
            queue.sending = None

    async def _apply(self, write: FencedWrite, batch: _Waiting) -> None:
        self.statements += 1
        try:
            written = await leases.apply_briefly(
                self._engine, write, [item for item, _ in batch.values()], self._clock()
            )
        except Exception as error:
            outage = classify(error)
            contended = outage is not None and outage.contention
            # A request id another job holds (uq_jobs_provider_request: a provider's bug).
            refused = isinstance(error, asyncpg.UniqueViolationError)
            if len(batch) > 1 and (contended or refused):
                # One row held too long by someone else (an owner's cancel, a reaper), or
                # one the database refuses, must not fail the whole batch: each job alone,
                # so only that one waits or fails.
                for job_id, waiting in batch.items():
                    await self._apply(write, {job_id: waiting})
                return
            _settle(batch, error=error)
        else:
            _settle(batch, written=written)


def _settle(
    batch: _Waiting,
    *,
    written: dict[str, Written] | None = None,
    error: BaseException | None = None,
) -> None:
    for job_id, (_, future) in batch.items():
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result((written or {}).get(job_id))
