"""Where the queued jobs this replica's streams watch stand in the queue.

A queued job's position moves as the jobs ahead of it are claimed while its version does
not, so its standing travels beside the versions: a stream puts the standing it holds on
a queued Job it sends, and on its KeepAlives (KeepAlive.standings); a standing is never a
new version. Every ``period`` seconds this component asks creation, in one call, for the
standing of every job a local stream watches while it is QUEUED (at most ``limit`` a
call: the longest unasked first, so more jobs are each refreshed less often), and owes a
KeepAlive to the streams whose job moved: its position changed, or its start estimate by
:data:`MOVED_SECONDS` or more. A job never asked about, or held at an older version than a stream
sends (queued again after an attempt), is asked about soon after (within about
:data:`FIRST_ASK_SECONDS`, in a call for such jobs alone), not at the next period."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify, log_unavailable
from services.notify.streams.inbox import Inbox
from services.notify.streams.registry import StreamRegistry

log = get_logger(__name__)

# The standings of the queued ones among the job ids, by id; None: creation could not say.
Fetch = Callable[[Sequence[str]], Awaitable[Mapping[str, pb.JobStanding] | None]]

MOVED_SECONDS = 10.0
# Jobs first sent within this long of each other share one call.
FIRST_ASK_SECONDS = 0.25


def moved(held: pb.JobStanding | None, fresh: pb.JobStanding) -> bool:
    """Whether a client holding ``held`` should be told ``fresh``."""
    if held is None or held.version != fresh.version:
        return True
    if held.queue_position != fresh.queue_position:
        return True
    if held.HasField("estimated_start_time") != fresh.HasField("estimated_start_time"):
        return True
    shift = fresh.estimated_start_time.ToMicroseconds() - held.estimated_start_time.ToMicroseconds()
    return abs(shift) >= MOVED_SECONDS * 1e6


class Standings:
    """A component: ``run`` refreshes every ``period`` seconds until ``stop``."""

    name = "queue-standings"

    def __init__(
        self, registry: StreamRegistry, fetch: Fetch, period: float, limit: int = 200
    ) -> None:
        self._registry = registry
        self._fetch = fetch
        self._period = period
        self._limit = limit
        self._held: dict[str, pb.JobStanding] = {}
        # When each watched queued job was last asked about (the event loop's clock).
        self._asked_at: dict[str, float] = {}
        self._first_asks = asyncio.Event()
        self._stopped = asyncio.Event()
        self._throttle = Throttle()

    def of(self, job_id: str, version: int) -> pb.JobStanding | None:
        """The standing held for ``job_id`` at ``version``; None when none is held for
        that version, in which case a job never asked about, or held at an older
        version, is asked about soon."""
        held = self._held.get(job_id)
        if held is not None and held.version == version:
            return held
        if job_id not in self._asked_at or (held is not None and held.version < version):
            self._first_asks.set()
        return None

    def _new(self, job_id: str, watchers: list[Inbox]) -> bool:
        """Never asked about, or held at an older version than a stream has."""
        if job_id not in self._asked_at:
            return True
        held = self._held.get(job_id)
        return held is not None and held.version < max(i.seen_version(job_id) for i in watchers)

    async def tick(self, *, new_only: bool = False) -> int:
        """One refresh (``new_only``: of the jobs never asked about); returns how many
        streams it owed a KeepAlive."""
        watchers = self._registry.queued_watchers()
        for job_id in [j for j in self._asked_at if j not in watchers]:
            del self._asked_at[job_id]
            self._held.pop(job_id, None)
        if new_only:
            asked = [j for j, inboxes in watchers.items() if self._new(j, inboxes)]
        else:
            asked = sorted(watchers, key=lambda j: self._asked_at.get(j, float("-inf")))
        asked = asked[: self._limit]
        if not asked:
            return 0
        fetched = await self._fetch(asked)
        if fetched is None:
            return 0
        now = asyncio.get_running_loop().time()
        nudged = 0
        for job_id in asked:
            self._asked_at[job_id] = now
            fresh = fetched.get(job_id)
            if fresh is None:  # no longer queued: its next version says what it is
                self._held.pop(job_id, None)
                continue
            if moved(self._held.get(job_id), fresh):
                for inbox in watchers[job_id]:
                    if inbox.seen_version(job_id) == fresh.version:
                        inbox.nudge()
                        nudged += 1
            self._held[job_id] = fresh
        return nudged

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self._stopped.is_set():
            periodic = loop.time() >= due
            if periodic:
                due = loop.time() + self._period
            self._first_asks.clear()
            try:
                await self.tick(new_only=not periodic)
            except Exception as error:
                outage = classify(error)
                if outage is None:
                    raise
                log_unavailable(self._throttle, outage.dependency, outage.kind, during="standings")
            await self._wait(due - loop.time())

    async def _wait(self, seconds: float) -> None:
        """Until the period ends, or shortly after a job was first sent."""
        waiters = [
            asyncio.ensure_future(self._stopped.wait()),
            asyncio.ensure_future(self._first_asks.wait()),
        ]
        try:
            await asyncio.wait(
                waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
        if self._first_asks.is_set() and not self._stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), FIRST_ASK_SECONDS)

    async def stop(self, deadline: float) -> None:
        self._stopped.set()
