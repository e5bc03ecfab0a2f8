"""Calls that wait for a job to finish (WaitJob, SubmitJob with ``Prefer: wait``), and the
one component per API process that wakes them.

A waiting call registers its job here, then reads the job, then sleeps until woken or its
time is up. Registering before the read means no change slips between them. Nothing is
polled per call: one LISTEN on ``creation_outbox`` (every job change writes an outbox row,
whose trigger NOTIFYs at commit) wakes the component, which reads the status of every job
being waited for in one statement (by primary key) and wakes the calls whose job settled.
Notifications that arrive while a check runs make one more check after it, never one
each; a check is also made every ``recheck_seconds`` (a notification lost while the
LISTEN connection was down, or a worker in another database session that never wrote).

Without waiting calls the component reads nothing: a notification costs one wake-up of
the loop. The wake-up is what WaitJob adds to a job's path (docs/benchmarks.md).

The component uses the event loop's clock only, never the service's injected clock, so
a test's frozen clock cannot stall it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Status
from services.creation.store.outbox import OUTBOX_CHANNEL
from services.kit.db import DriverStatement, driver_fetch
from services.kit.listen import Listener
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

# A wait lasts at most this long (WaitJob's timeout, Prefer: wait=N).
MAX_WAIT_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 30.0
# Statuses that end a wait: the terminal ones, and NEEDS_ATTENTION (an operator decides,
# which may take hours: the caller is told now).
SETTLED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.NEEDS_ATTENTION)

# Rides the primary key: one index probe per waited-for job. Compiled once, run on the
# driver (a wake's cost is this round trip).
_SETTLED_AMONG = DriverStatement(
    "SELECT job_id::text FROM creation.jobs WHERE job_id = ANY($1::uuid[])"
    " AND (status = ANY($2::text[]) OR deleted_at IS NOT NULL)",
    ("job_ids", "settled"),
)
_SETTLED_VALUES = [s.value for s in SETTLED]


class JobWaits:
    """A component: ``run()`` until ``stop()``; calls wait through :meth:`watching`."""

    name = "job-waits"

    def __init__(
        self,
        engine: AsyncEngine,
        database_url: str,
        *,
        recheck_seconds: float = 2.0,
        min_gap_seconds: float = 0.02,
    ) -> None:
        self._engine = engine
        self.listener = Listener(database_url, OUTBOX_CHANNEL)
        self._recheck = recheck_seconds
        self._min_gap = min_gap_seconds
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._stopping = asyncio.Event()
        self._log = Throttle()
        self.checks = 0  # statements sent, for tests and the bench

    @property
    def waiting(self) -> int:
        """Calls waiting now."""
        return sum(len(events) for events in self._waiting.values())

    @contextmanager
    def watching(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set once ``job_id`` has settled (or may have: a deleted job); enter
        it before reading the job."""
        event = asyncio.Event()
        if self._stopping.is_set():
            event.set()  # a draining server answers the job as it is
        self._waiting.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._waiting.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[job_id]

    async def run(self) -> None:
        listening = asyncio.create_task(self.listener.run(), name=self.listener.name)
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping.is_set():
                if listening.done():
                    listening.result()  # a listener that ends on its own takes us down
                    raise RuntimeError("the job-waits listener stopped")
                await self._woken_or_stopped()
                if self._stopping.is_set():
                    break
                if self._waiting:
                    started = loop.time()
                    await self._check(list(self._waiting))
                    # Bounds the checks a busy queue causes: news within the gap wait
                    # for the next check (a waiting call learns of its job this late).
                    left = self._min_gap - (loop.time() - started)
                    if left > 0:
                        await asyncio.sleep(left)
        finally:
            await self.listener.stop(0)
            await asyncio.gather(listening, return_exceptions=True)

    async def _woken_or_stopped(self) -> None:
        """Returns on a notification, after the re-check period, or at once on stop (a
        stopping server must not wait out the period)."""
        woken = asyncio.ensure_future(self.listener.woken(self._recheck))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((woken, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            stopping.cancel()

    async def _check(self, job_ids: Sequence[str]) -> None:
        try:
            rows = await driver_fetch(
                self._engine, _SETTLED_AMONG, job_ids=list(job_ids), settled=_SETTLED_VALUES
            )
            settled = [row[0] for row in rows]
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            if self._log.admit(outage.kind) is not None:
                log.warning("job_waits_check_failed", dependency=outage.kind)
            return  # the waits end by their time; the next check tries again
        finally:
            self.checks += 1
        for job_id in settled:
            for event in self._waiting.get(job_id, ()):
                event.set()

    async def stop(self, deadline: float) -> None:
        self._stopping.set()
        await self.listener.stop(deadline)
        # Calls still waiting answer the job as it is: their server is draining.
        for events in self._waiting.values():
            for event in events:
                event.set()


_PREFER_WAIT = re.compile(r"^\s*wait\s*=\s*\"?(\d{1,9})\"?\s*$", re.IGNORECASE)


def preferred_wait(values: Sequence[str]) -> float | None:
    """The seconds a ``Prefer`` header (RFC 7240; any number of them, comma-separated
    preferences, each with optional ``;`` parameters) asks to wait, capped at
    :data:`MAX_WAIT_SECONDS`; None when there is no well-formed ``wait`` preference. The
    first ``wait`` counts (RFC 7240 §2: a repeated preference takes its first value)."""
    for value in values:
        for preference in value.split(","):
            token = preference.split(";", 1)[0]
            if not token.strip().lower().startswith("wait"):
                continue
            matched = _PREFER_WAIT.match(token)
            if matched is None:
                continue  # "wait" with no number: not understood, so ignored
            return min(float(matched.group(1)), MAX_WAIT_SECONDS)
    return None
