"""What the database driver's errors mean: the one module that knows asyncpg's, SQLAlchemy's
and the socket's exceptions, whatever layer raised them (asyncpg on a pooled connection,
SQLAlchemy's DBAPIError wrapping it, the pool, a bare socket under the driver).

A driver error is one of three things, decided here once:

- an **outage** (:func:`failure_kind`: ``unreachable``, ``timeout``, ``pool_timeout``,
  ``statement_timeout``): the database did not answer; a retry later may work;
- **contention** (``lock_timeout``, ``deadlock``, ``serialization_failure``): the request
  gave way to another one and did nothing; a retry now may work;
- a **unique violation** (:func:`unique_violation`, by constraint name): a fact a store
  turns into its domain's error (a key already taken, say);

anything else is a bug. :mod:`services.kit.outages` says how the first two answer
(``classify``, ``Outage.api_error``, ``DatabaseFailure``), the same in every service.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import exc as sa_exc

# Lock waits that ended without the request doing anything. A deadlock belongs here: the
# writers' lock orders rule one out (creation's migration 0013), but should one happen,
# PostgreSQL aborts one side, which is a retry for a client and a later pass for a worker
# loop, not a bug that stops the process. So does a serializable transaction that lost
# its race (SQLSTATE 40001): it did nothing and may succeed when run again.
CONTENTION_KINDS = frozenset({"lock_timeout", "deadlock", "serialization_failure"})

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
    if isinstance(error, asyncpg.exceptions.SerializationError):
        return "serialization_failure"
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


def failure_kind(error: BaseException) -> str | None:
    """The outage or contention kind behind ``error``; None when the database answered
    (a bug, a constraint, or no database error at all)."""
    for link in _chain(error):
        kind = _kind(link)
        if kind is not None:
            return kind
    return None


def unique_violation(error: BaseException) -> str | None:
    """The name of the unique constraint (or index) ``error`` violated: asyncpg's own
    error or SQLAlchemy's wrapping it; None when it is no unique violation. Stores compare
    it with the constraints they expect and raise their domain's error; any other stays a
    bug. Only what ``error`` wraps counts, not what it was raised while handling: a domain
    error raised in a handler of a violation is not one itself."""
    current: BaseException | None = error
    for _ in range(8):
        if current is None:
            break
        if isinstance(current, asyncpg.exceptions.UniqueViolationError):
            return str(current.constraint_name or "")
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None
