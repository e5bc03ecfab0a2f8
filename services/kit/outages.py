"""Outages as clients should see them: a dependency that is down, frozen or saturated is
UNAVAILABLE (or ABORTED for contention) with a reason naming it and a retry hint, never
INTERNAL; and the log says so in one short line per kind, not a stack trace per call.

A database error answers the same in every service, by one of two paths that end in
:meth:`Outage.api_error`: a call lets the driver's error rise and the server stack
:func:`classify`-ies it, or a store raises :class:`DatabaseFailure` (or its service's
subclass of it) through :func:`database_failures`. What a driver error means is
:mod:`services.kit.db_errors`' to say.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from services.kit.db_errors import CONTENTION_KINDS, failure_kind
from services.kit.errors import ApiError, DomainError
from services.kit.logging import get_logger

log = get_logger(__name__)


class Reason:
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    LOCK_TIMEOUT = "LOCK_TIMEOUT"


# A hint, not a promise: most outages worth retrying are over within seconds.
RETRY_AFTER_SECONDS = 1.0

_CONTENTION_MESSAGES = {
    "lock_timeout": "the request waited too long for a lock; try again",
    "deadlock": "the request gave way to another in a lock wait; try again",
    "serialization_failure": "the request gave way to another that changed the same rows; "
    "try again",
}


@dataclass(frozen=True)
class Outage:
    """A failure that is about a dependency, not about the request."""

    dependency: str
    kind: str  # e.g. unreachable, timeout, pool_timeout, statement_timeout, lock_timeout

    @property
    def contention(self) -> bool:
        """The request gave way to another (a lock wait past lock_timeout, a deadlock, a
        serialization failure): it did nothing and may succeed as soon as it is retried."""
        return self.kind in CONTENTION_KINDS

    def api_error(self) -> ApiError:
        """How every service answers this outage."""
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


def classify(error: BaseException) -> Outage | None:
    """The database outage (or contention) behind ``error``, or None when it is something
    else."""
    kind = failure_kind(error)
    return None if kind is None else Outage("database", kind)


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


class DatabaseFailure(DependencyUnavailable):
    """A store's database did not answer, or its request gave way to another (``outage``
    says which): a domain error that answers exactly as the driver's own error would."""

    def __init__(self, outage: Outage) -> None:
        reason = Reason.LOCK_TIMEOUT if outage.contention else Reason.DATABASE_UNAVAILABLE
        super().__init__(reason, outage.dependency, outage.kind)
        self.outage = outage

    def to_api_error(self) -> ApiError:
        return self.outage.api_error()


@contextmanager
def database_failures(
    raised_as: Callable[[Outage], DatabaseFailure] = DatabaseFailure,
) -> Iterator[None]:
    """The boundary of a store that names its failures: a driver error that is an outage
    or contention leaves as ``raised_as(outage)`` (the service's subclass of
    :class:`DatabaseFailure`). Anything else passes unchanged: a domain error, a bug, a
    constraint (the store translates the unique violations it expects itself)."""
    try:
        yield
    except DomainError:
        raise
    except Exception as error:
        outage = classify(error)
        if outage is None:
            raise
        raise raised_as(outage) from error


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
