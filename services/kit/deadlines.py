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
so that is the reason given; a call to another service is given the time left
(:func:`within`) and answers with that service's reason before the deadline passes.

A server-streaming call has the deadline until its first message: its setup
(authentication, the request's checks, the first read) is bounded, its life is not. A
client-streaming call's clock runs only while it is not waiting for the client's next
message: an upload's pace is the client's. A handler that waits on purpose (for news the
caller asked to wait for) stops the clock meanwhile (:func:`paused`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import TracebackType

from services.kit.errors import ApiError
from services.kit.outages import DependencyUnavailable, Outage

# A client's deadline less this share of its time left (at most the cap) is ours: the
# answer must travel back and be read before the client's own timer fires.
CLIENT_RESERVE_SHARE = 0.2
CLIENT_RESERVE_MAX_SECONDS = 0.25

_current: ContextVar[CallDeadline | None] = ContextVar("call_deadline", default=None)


def budget_seconds(service_seconds: float, client_remaining: float | None) -> float:
    """How long a call may take: the service's deadline, or the client's time left less
    its reserve when that is shorter."""
    if client_remaining is None:
        return service_seconds
    reserve = min(client_remaining * CLIENT_RESERVE_SHARE, CLIENT_RESERVE_MAX_SECONDS)
    return max(0.0, min(service_seconds, client_remaining - reserve))


class CallDeadlineReached(DependencyUnavailable):
    """The call's deadline passed while it waited inside the service."""

    def __init__(self) -> None:
        super().__init__("DATABASE_UNAVAILABLE", "database", "call_deadline")

    def to_api_error(self) -> ApiError:
        return Outage("database", "call_deadline").api_error()


class CallDeadline:
    """The deadline of the running call, entered around its handler (``async with``).
    On expiry the handler's wait is cancelled and :class:`CallDeadlineReached` raised."""

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._seconds = seconds
        self._when: float | None = self._loop.time() + seconds
        self._timeout = asyncio.timeout_at(self._when)
        self._paused_left: float | None = None
        self._token: Token[CallDeadline | None] | None = None

    def remaining(self) -> float | None:
        """Seconds left; None once lifted or while paused."""
        if self._when is None:
            return None
        return max(0.0, self._when - self._loop.time())

    def lift(self) -> None:
        """No deadline from now on (a stream that has sent its first message)."""
        self._when = None
        self._paused_left = None
        self._timeout.reschedule(None)

    def pause(self) -> None:
        """Stops the clock (the call waits for its client)."""
        if self._when is None:
            return
        self._paused_left = self.remaining()
        self._when = None
        self._timeout.reschedule(None)

    def resume(self) -> None:
        if self._paused_left is None:
            return
        self._when = self._loop.time() + self._paused_left
        self._paused_left = None
        self._timeout.reschedule(self._when)

    async def __aenter__(self) -> CallDeadline:
        self._token = _current.set(self)
        await self._timeout.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            if self._timeout.expired():
                raise CallDeadlineReached() from None
            raise


def current() -> CallDeadline | None:
    return _current.get()


@contextmanager
def paused() -> Iterator[None]:
    """Stops the running call's clock for a wait that is what the caller asked for, not
    work of the service's (a stream waiting for the first state of a job just made)."""
    deadline = _current.get()
    if deadline is None:
        yield
        return
    deadline.pause()
    try:
        yield
    finally:
        deadline.resume()


def within(seconds: float) -> float:
    """``seconds``, or less when the running call's deadline leaves less: a call to
    another service ends (and answers with that service's reason) before ours does."""
    deadline = _current.get()
    left = None if deadline is None else deadline.remaining()
    if left is None:
        return seconds
    reserve = min(left * CLIENT_RESERVE_SHARE, CLIENT_RESERVE_MAX_SECONDS)
    return max(0.0, min(seconds, left - reserve))
