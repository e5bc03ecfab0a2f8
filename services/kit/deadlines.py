"""Every call's deadline: the time by which a call answers, whatever it waits for.

Each wait a call makes has its own bound (a pooled connection, a statement, a lock, a
call to another service), but waits in a row add up: three 2 s waits are a 6 s call. So
the server stack gives every call one deadline (:class:`CallDeadline`): the service's own
(``ATELIER_CALL_DEADLINE``, 3 s by default) or the client's, whichever comes first, the
client's less a small reserve so that our answer, not the client's own timer, reaches it.
When the deadline passes, the call's wait is cancelled and the call answers UNAVAILABLE
(:class:`CallDeadlineReached`).

What a call waits for within the service is the database (a pooled connection, a
statement, its turn among the same user's requests, a read it shares with other calls),
so that is the reason given, unless the wait names another dependency
(:func:`waiting_for`); a call to another service is given the time left (:func:`within`)
and answers with that service's reason before the deadline passes.

A server-streaming call has the deadline until its first message: its setup
(authentication, the request's checks, the first read) is bounded, its life is not. A
client-streaming call's clock runs only while it is not waiting for the client's next
message: an upload's pace is the client's. A handler that waits on purpose (for news the
caller asked to wait for) stops the clock meanwhile (:func:`paused`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import TracebackType

from services.kit.outages import DatabaseFailure, Outage

# A client's deadline less this share of its time left (at most the cap) is ours: the
# answer must travel back and be read before the client's own timer fires, and a loaded
# host can hold it a few hundred milliseconds on the way.
CLIENT_RESERVE_SHARE = 0.2
CLIENT_RESERVE_MAX_SECONDS = 0.5
# How often the calls past their deadline are looked for: a deadline ends a call this
# much late at most (the client's reserve covers it).
SWEEP_SECONDS = 0.025

_current: ContextVar[CallDeadline | None] = ContextVar("call_deadline", default=None)


def _reserve(left: float) -> float:
    return min(left * CLIENT_RESERVE_SHARE, CLIENT_RESERVE_MAX_SECONDS) + SWEEP_SECONDS


def budget_seconds(service_seconds: float, client_remaining: float | None) -> float:
    """How long a call may take: the service's deadline, or the client's time left less
    its reserve when that is shorter."""
    if client_remaining is None:
        return service_seconds
    return max(0.0, min(service_seconds, client_remaining - _reserve(client_remaining)))


class CallDeadlineReached(DatabaseFailure):
    """The call's deadline passed while it waited inside the service."""

    def __init__(self) -> None:
        super().__init__(Outage("database", "call_deadline"))


class _Sweeper:
    """One timer for every call's deadline on a loop: each sweep cancels the calls past
    theirs. A timer per call (asyncio.timeout) costs about a tenth of a cheap call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: set[CallDeadline] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, call: CallDeadline) -> None:
        self._calls.add(call)
        if self._timer is None:
            self._timer = self.loop.call_later(SWEEP_SECONDS, self._sweep)

    def discard(self, call: CallDeadline) -> None:
        self._calls.discard(call)

    def _sweep(self) -> None:
        now = self.loop.time()
        for call in [c for c in self._calls if c.due(now)]:
            self._calls.discard(call)
            call.expire()
        self._timer = self.loop.call_later(SWEEP_SECONDS, self._sweep) if self._calls else None


_sweeper: _Sweeper | None = None


def _sweeper_of(loop: asyncio.AbstractEventLoop) -> _Sweeper:
    # A process runs one loop at a time (a test session may run several in turn).
    global _sweeper
    if _sweeper is None or _sweeper.loop is not loop:
        _sweeper = _Sweeper(loop)
    return _sweeper


class CallDeadline:
    """The deadline of the running call, entered around its handler (``async with``).
    On expiry the handler's wait is cancelled and :class:`CallDeadlineReached` raised
    (a cancellation from elsewhere, such as the client's, stays a cancellation)."""

    __slots__ = (
        "_cancelling",
        "_expired",
        "_expired_while",
        "_loop",
        "_paused_left",
        "_sweeper",
        "_task",
        "_token",
        "_waiting_for",
        "_when",
    )

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = _sweeper_of(self._loop)
        self._when: float | None = self._loop.time() + seconds
        self._paused_left: float | None = None
        self._expired = False
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._token: Token[CallDeadline | None] | None = None
        # What the call waits for now (see waiting_for), and what it waited for when its
        # deadline passed; None: the database.
        self._waiting_for: Callable[[], Exception] | None = None
        self._expired_while: Callable[[], Exception] | None = None

    def due(self, now: float) -> bool:
        return self._when is not None and self._when <= now

    def expire(self) -> None:
        self._expired = True
        self._expired_while = self._waiting_for
        if self._task is not None:
            self._task.cancel()

    def remaining(self) -> float | None:
        """Seconds left; None once lifted or while paused."""
        if self._when is None:
            return None
        return max(0.0, self._when - self._loop.time())

    def lift(self) -> None:
        """No deadline from now on (a stream that has sent its first message)."""
        self._when = None
        self._paused_left = None
        self._sweeper.discard(self)

    def pause(self) -> None:
        """Stops the clock (the call waits for its client)."""
        if self._when is None or self._expired:
            return
        self._paused_left = self.remaining()
        self._when = None
        self._sweeper.discard(self)

    def resume(self) -> None:
        if self._paused_left is None:
            return
        self._when = self._loop.time() + self._paused_left
        self._paused_left = None
        self._sweeper.add(self)

    def no_later_than(self, when: float) -> None:
        """The deadline at ``when`` (the loop's clock) if that is sooner."""
        if self._when is not None and when < self._when:
            self._when = when

    async def __aenter__(self) -> CallDeadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a call's deadline is entered in the call's task")
        self._task = task
        self._cancelling = task.cancelling()
        self._token = _current.set(self)
        self._sweeper.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._sweeper.discard(self)
        if self._token is not None:
            _current.reset(self._token)
        if self._expired and self._task is not None:
            # Ours unless someone else cancelled the task too (asyncio.timeout's rule).
            ours = self._task.uncancel() <= self._cancelling
            if ours and exc_type is asyncio.CancelledError:
                waited_for = self._expired_while
                raise (CallDeadlineReached() if waited_for is None else waited_for()) from None


def current() -> CallDeadline | None:
    return _current.get()


def answer_by(client_remaining: float | None) -> float | None:
    """When (the loop's clock) an answer must leave to reach a client that has
    ``client_remaining`` seconds left, its reserve kept; None: the client set no deadline."""
    if client_remaining is None:
        return None
    left = max(0.0, client_remaining)
    return asyncio.get_running_loop().time() + max(0.0, left - _reserve(left))


@contextmanager
def paused(until: float | None = None) -> Iterator[None]:
    """Stops the running call's clock for a wait that is what the caller asked for, not
    work of the service's (a stream waiting for the first state of a job just made; a
    WaitJob). The wait itself must end by the client's deadline; ``until`` (the loop's
    clock, see :func:`answer_by`) is then the latest the rest of the call may end: the
    service's time left, paused meanwhile, does not outlast the client's."""
    deadline = _current.get()
    if deadline is None:
        yield
        return
    deadline.pause()
    try:
        yield
    finally:
        deadline.resume()
        if until is not None:
            deadline.no_later_than(until)


@contextmanager
def waiting_for(unavailable: Callable[[], Exception]) -> Iterator[None]:
    """Names what the running call waits for meanwhile when it is not the database (an
    object store, say): should the deadline pass, the call fails with ``unavailable()``."""
    deadline = _current.get()
    if deadline is None:
        yield
        return
    outer, deadline._waiting_for = deadline._waiting_for, unavailable
    try:
        yield
    finally:
        deadline._waiting_for = outer


def within(seconds: float) -> float:
    """``seconds``, or less when the running call's deadline leaves less: a call to
    another service ends (and answers with that service's reason) before ours does."""
    deadline = _current.get()
    left = None if deadline is None else deadline.remaining()
    if left is None:
        return seconds
    return max(0.0, min(seconds, left - _reserve(left)))
