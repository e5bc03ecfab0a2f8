"""Outages as clients should see them: a dependency that is down, frozen or saturated is
UNAVAILABLE (or ABORTED for a lock wait) with a reason naming it and a retry hint, never
INTERNAL; and the log says so in one short line per kind, not a stack trace per call.

:func:`classify` recognises the database failures that are about reaching PostgreSQL
(refused or lost connections, client and server timeouts, a full pool, a server that is
starting or out of connection slots, a lock wait past lock_timeout or ended by the
deadlock detector), whatever layer (SQLAlchemy, asyncpg, the socket) raised them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import grpc
from sqlalchemy import exc as sa_exc

from services.kit.errors import ApiError, DomainError
from services.kit.logging import get_logger

log = get_logger(__name__)


class Reason:
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    LOCK_TIMEOUT = "LOCK_TIMEOUT"


# A hint, not a promise: most outages worth retrying are over within seconds.
RETRY_AFTER_SECONDS = 1.0

# Lock waits that ended without the request doing anything. A deadlock belongs here: the
# writers' lock orders rule one out (creation's migration 0013), but should one happen,
# PostgreSQL aborts one side, which is a retry for a client and a later pass for a worker
# loop, not a bug that stops the process.
_CONTENTION_MESSAGES = {
    "lock_timeout": "the request waited too long for a lock; try again",
    "deadlock": "the request gave way to another in a lock wait; try again",
}
CONTENTION_KINDS = frozenset(_CONTENTION_MESSAGES)

# Server-side conditions that mean "cannot serve you now", not "your request is wrong".
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.CannotConnectNowError,  # starting up or shutting down
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,  # asyncpg's own "connection is closed" and the like
)


@dataclass(frozen=True)
class Outage:
    """A failure that is about a dependency, not about the request."""

    dependency: str
    kind: str  # e.g. unreachable, timeout, pool_timeout, statement_timeout, lock_timeout

    @property
    def contention(self) -> bool:
        """A lock wait that ended (past lock_timeout, or chosen to give way in a
        deadlock): the request did nothing and may succeed as soon as it is retried."""
        return self.kind in CONTENTION_KINDS

    def api_error(self) -> ApiError:
        if self.contention:
            # Contention, not an outage: the request may succeed as soon as it is retried.
            return ApiError(
                grpc.StatusCode.ABORTED,
                Reason.LOCK_TIMEOUT,
                _CONTENTION_MESSAGES[self.kind],
                retry_after_seconds=RETRY_AFTER_SECONDS,
            )
        return ApiError(
            grpc.StatusCode.UNAVAILABLE,
            Reason.DATABASE_UNAVAILABLE,
            "the database is not available; try again",
            retry_after_seconds=RETRY_AFTER_SECONDS,
            metadata={"dependency": self.dependency},
        )


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error, what it wraps (SQLAlchemy's ``orig``) and its causes, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending and len(seen) < 16:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        wrapped = orig if isinstance(orig, BaseException) else None
        pending.extend([wrapped, current.__cause__, current.__context__])


def _raised_by_database_driver(error: BaseException) -> bool:
    """A bare socket error or timeout counts as the database's only if it came up through
    the driver or the pool (and not, say, through an S3 client)."""
    tb: TracebackType | None = error.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.startswith(("asyncpg", "sqlalchemy")):
            return True
        tb = tb.tb_next
    return False


def _kind(error: BaseException) -> str | None:
    if isinstance(error, asyncpg.exceptions.LockNotAvailableError):
        return "lock_timeout"
    if isinstance(error, asyncpg.exceptions.DeadlockDetectedError):
        return "deadlock"
    if isinstance(error, asyncpg.exceptions.QueryCanceledError):
        return "statement_timeout"
    if isinstance(error, sa_exc.TimeoutError):
        return "pool_timeout"
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return "unreachable"
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return "unreachable"
    if isinstance(error, TimeoutError) and _raised_by_database_driver(error):
        return "timeout"
    if isinstance(error, OSError) and _raised_by_database_driver(error):
        return "unreachable"
    return None


def classify(error: BaseException) -> Outage | None:
    """The database outage behind ``error``, or None when it is something else."""
    for link in _chain(error):
        kind = _kind(link)
        if kind is not None:
            return Outage("database", kind)
    return None


class DependencyUnavailable(DomainError):
    """Another service we call is down, frozen or itself missing a dependency. ``cause``
    carries that service's own reason (e.g. DATABASE_UNAVAILABLE) for operators."""

    def __init__(
        self,
        reason: str,
        dependency: str,
        cause: str = "",
        retry_after_seconds: float = RETRY_AFTER_SECONDS,
    ) -> None:
        super().__init__(reason, dependency, cause)
        self.reason = reason
        self.dependency = dependency
        self.cause = cause
        self.retry_after_seconds = retry_after_seconds

    def to_api_error(self) -> ApiError:
        metadata = {"dependency": self.dependency}
        if self.cause:
            metadata["cause"] = self.cause
        return ApiError(
            grpc.StatusCode.UNAVAILABLE,
            self.reason,
            f"{self.dependency} is not available; try again",
            retry_after_seconds=self.retry_after_seconds,
            metadata=metadata,
        )


class Throttle:
    """At most one log line per key per window; the next line says how many it stood for.
    An outage fails every call: the log should say so once, not thousands of times."""

    def __init__(
        self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window_seconds
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def admit(self, key: str) -> int | None:
        """None: stay quiet. Otherwise log now; the value counts the lines skipped since
        the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._window:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)


def log_unavailable(throttle: Throttle, dependency: str, kind: str, **fields: Any) -> None:
    """One short line per dependency and kind per throttle window, never a stack trace."""
    suppressed = throttle.admit(f"{dependency}:{kind}")
    if suppressed is not None:
        log.warning(
            "dependency_unavailable",
            dependency=dependency,
            kind=kind,
            suppressed=suppressed,
            **fields,
        )
