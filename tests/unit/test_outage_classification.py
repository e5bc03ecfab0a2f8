"""Which failures are outages (and of what), and how often the log may say so."""

from __future__ import annotations

import asyncpg
import grpc
import pytest
from sqlalchemy import exc as sa_exc

from services.kit.outages import DependencyUnavailable, Outage, Throttle, classify


def _wrapped(cause: BaseException) -> sa_exc.DBAPIError:
    """What SQLAlchemy raises for a driver error: a DBAPIError whose ``orig`` is the
    adapted error, caused by asyncpg's own."""
    adapted = Exception(str(cause))
    adapted.__cause__ = cause
    return sa_exc.DBAPIError("SELECT 1", None, adapted)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (_wrapped(asyncpg.exceptions.CannotConnectNowError("starting up")), "unreachable"),
        (_wrapped(asyncpg.exceptions.TooManyConnectionsError("slots")), "unreachable"),
        (_wrapped(asyncpg.exceptions.AdminShutdownError("shutdown")), "unreachable"),
        (_wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("gone")), "unreachable"),
        (_wrapped(asyncpg.exceptions.QueryCanceledError("statement timeout")), "statement_timeout"),
        (_wrapped(asyncpg.exceptions.LockNotAvailableError("lock timeout")), "lock_timeout"),
        (_wrapped(asyncpg.exceptions.DeadlockDetectedError("deadlock detected")), "deadlock"),
        (sa_exc.TimeoutError("QueuePool limit reached"), "pool_timeout"),
    ],
)
def test_database_failures_are_outages(error: BaseException, kind: str) -> None:
    assert classify(error) == Outage("database", kind)


def test_a_bug_is_not_an_outage() -> None:
    assert classify(RuntimeError("bug")) is None
    assert classify(_wrapped(asyncpg.exceptions.UniqueViolationError("dup"))) is None
    # A socket error or timeout that did not come through the driver names no database.
    assert classify(ConnectionRefusedError()) is None
    assert classify(TimeoutError()) is None


async def test_a_refused_connection_through_the_driver_is_an_outage() -> None:
    with pytest.raises(ConnectionRefusedError) as caught:
        await asyncpg.connect(host="127.0.0.1", port=1, timeout=2)
    assert classify(caught.value) == Outage("database", "unreachable")


def test_outages_answer_unavailable_and_lock_waits_aborted() -> None:
    down = Outage("database", "unreachable").api_error()
    assert (down.code, down.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
    assert down.retry_after_seconds
    busy = Outage("database", "lock_timeout").api_error()
    assert (busy.code, busy.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")
    assert busy.retry_after_seconds
    gave_way = Outage("database", "deadlock").api_error()
    assert (gave_way.code, gave_way.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")
    assert gave_way.retry_after_seconds
    assert "gave way" in gave_way.message
    # The fenced writer splits a batch on either (one held row must not fail them all).
    assert Outage("database", "deadlock").contention
    assert Outage("database", "lock_timeout").contention
    assert not Outage("database", "unreachable").contention


def test_a_dependency_names_itself_and_keeps_its_cause() -> None:
    error = DependencyUnavailable("MEDIA_UNAVAILABLE", "media", "DATABASE_UNAVAILABLE", 3)
    api = error.to_api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.UNAVAILABLE, "MEDIA_UNAVAILABLE")
    assert api.metadata == {"dependency": "media", "cause": "DATABASE_UNAVAILABLE"}
    assert api.retry_after_seconds == 3


def test_throttle_admits_one_line_per_window_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(window_seconds=10, clock=lambda: now[0])
    assert throttle.admit("db:unreachable") == 0
    assert throttle.admit("db:unreachable") is None
    assert throttle.admit("db:timeout") == 0  # another kind has its own window
    now[0] = 5
    assert throttle.admit("db:unreachable") is None
    now[0] = 10
    assert throttle.admit("db:unreachable") == 2
