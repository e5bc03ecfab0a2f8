"""A stream's inbox: what is waiting to be sent, bounded by keeping only the latest state
per job, so a slow reader costs one state per job however many changes it misses."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence

from services.notify.streams.change import Change


class EndReason(enum.Enum):
    """Why the server ends a stream on purpose (StreamEndReason in the contract)."""

    DRAINING = "draining"
    MAX_DURATION = "max_duration"
    SLOW_READER = "slow_reader"


class Inbox:
    """Pending changes of one stream. ``offer`` never blocks and never grows past
    ``limit`` jobs; a newer version of a pending job replaces the older one (coalescing).
    A version not above what the stream already has (sent or pending) is dropped, so
    duplicates and reordered deliveries change nothing."""

    __slots__ = (
        "_limit",
        "_pending",
        "_seen",
        "_signalled",
        "_waiter",
        "deadline",
        "ended",
        "floor_seq",
        "keep_alive_due",
        "last_sent",
        "max_seq",
        "open_jobs",
        "queued_jobs",
    )

    def __init__(self, limit: int, *, now: float = 0.0, deadline: float = float("inf")) -> None:
        self._limit = limit
        # The stream clock's view (event loop time): when the stream last sent anything,
        # when it must end by itself, and whether a keep-alive is owed.
        self.last_sent = now
        self.deadline = deadline
        self.keep_alive_due = False
        self._pending: dict[str, Change] = {}
        # The highest version per job this stream has taken (sent or pending).
        self._seen: dict[str, int] = {}
        # Jobs this stream has seen in a non-terminal state: the backstop watches them.
        self.open_jobs: set[str] = set()
        # Jobs whose latest version taken is QUEUED: their standing is refreshed.
        self.queued_jobs: set[str] = set()
        # A wake-up is owed (something to send, a keep-alive, an end); a bare future
        # rather than an asyncio.Event: ten thousand streams each hold one.
        self._signalled = False
        self._waiter: asyncio.Future[None] | None = None
        self.ended: EndReason | None = None
        # The highest cursor (projection seq) taken: the backstop asks for what is above.
        self.max_seq = 0
        # A WatchJobs stream's starting cursor, once its snapshot is taken (settle): no
        # change at or below it is taken any more. None: not settled (or a WatchJob).
        self.floor_seq: int | None = None

    def seen_version(self, job_id: str) -> int:
        return self._seen.get(job_id, 0)

    def skip_through(self, job_id: str, version: int) -> None:
        """The client already has ``version`` of ``job_id`` (WatchJob's after_version)."""
        if version > self._seen.get(job_id, 0):
            self._seen[job_id] = version

    def settle(self, snapshot: Sequence[Change], cursor: int) -> None:
        """A WatchJobs stream's start: takes its snapshot, which holds every change at or
        below ``cursor`` the client wants (a resumed client has the rest already; a fresh
        one wants unfinished jobs only). Changes at or below it that arrived meanwhile (a
        backstop pass that read before the snapshot) are dropped, and later ones refused."""
        for change in snapshot:
            self.offer(change)
        in_snapshot = {change.job_id for change in snapshot}
        for job_id, change in list(self._pending.items()):
            if change.seq <= cursor and job_id not in in_snapshot:
                del self._pending[job_id]
        self.max_seq = max(self.max_seq, cursor)
        self.floor_seq = cursor

    def offer(self, change: Change) -> bool:
        """Takes ``change`` if it is newer than what the stream has; True when taken."""
        if self.ended is not None or change.version <= self._seen.get(change.job_id, 0):
            return False
        if self.floor_seq is not None and change.seq <= self.floor_seq:
            return False
        if change.job_id not in self._pending and len(self._pending) >= self._limit:
            self.end(EndReason.SLOW_READER)
            return False
        self._seen[change.job_id] = change.version
        self._pending[change.job_id] = change
        self.max_seq = max(self.max_seq, change.seq)
        if change.terminal:
            self.open_jobs.discard(change.job_id)
        else:
            self.open_jobs.add(change.job_id)
        if change.queued:
            self.queued_jobs.add(change.job_id)
        else:
            self.queued_jobs.discard(change.job_id)
        self._wake()
        return True

    def poke(self) -> None:
        """Something may have changed (a WatchAllJobs stream reads the projection itself:
        it is told that, not what)."""
        self._wake()

    def nudge(self) -> None:
        """The stream has been silent too long: it owes the client a keep-alive."""
        self.keep_alive_due = True
        self._wake()

    def end(self, reason: EndReason) -> None:
        """Asks the stream to end with a StreamEnd (the first reason wins)."""
        if self.ended is None:
            self.ended = reason
        self._wake()

    def take(self) -> list[Change]:
        """Everything pending, oldest cursor first (so a cursor handed out after a message
        never passes a change still waiting in the same batch)."""
        if len(self._pending) == 1:
            changes = list(self._pending.values())
        else:
            changes = sorted(self._pending.values(), key=lambda c: c.seq)
        self._pending.clear()
        if self.ended is None:
            self._signalled = False
        return changes

    def _wake(self) -> None:
        self._signalled = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def peek(self) -> list[Change]:
        """What is pending, without taking it."""
        return list(self._pending.values())

    @property
    def pending(self) -> int:
        return len(self._pending)

    def wake_up(self) -> asyncio.Future[None] | None:
        """The future the next wake-up completes, or None when one is already owed. The
        streams' sending loops await it directly: a coroutine less per message than
        :meth:`wait`, and a broadcast pays it once per stream."""
        if self._signalled:
            return None
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        return waiter

    async def wait(self, seconds: float | None = None) -> bool:
        """Waits (up to ``seconds``, if given) for something to send, a keep-alive owed or
        an end; False when the time ran out with nothing."""
        if self._signalled:
            return True
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            if seconds is None:
                await self._waiter
            else:
                async with asyncio.timeout(seconds):
                    await self._waiter
        except TimeoutError:
            return False
        finally:
            self._waiter = None
        return True
