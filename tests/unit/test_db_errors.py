"""The kit's one database-error boundary: what a driver error means (outage, contention,
unique violation by constraint name), decided once from asyncpg's real exception classes
however SQLAlchemy wraps them, and answered the same in every service."""

from __future__ import annotations

from typing import Any

import asyncpg
import grpc
import pytest
from sqlalchemy import exc as sa_exc

from services.kit.db_errors import CONTENTION_KINDS, failure_kind, unique_violation
from services.kit.deadlines import CallDeadlineReached
from services.kit.errors import DomainError
from services.kit.outages import DatabaseFailure, Outage, classify, database_failures


def _postgres(sqlstate: str, **fields: str) -> Any:
    """The exception asyncpg raises for a server error with this SQLSTATE (its class is
    chosen from the code, as on a real connection)."""
    codes = {"constraint_name": "n", "table_name": "t"}
    return asyncpg.exceptions.PostgresError.new(
        {"C": sqlstate, "M": f"server said {sqlstate}", **{codes[k]: v for k, v in fields.items()}}
    )


def _by_sqlalchemy(cause: BaseException, kind: type[sa_exc.DBAPIError]) -> sa_exc.DBAPIError:
    """What SQLAlchemy raises for a driver error: its DBAPIError (IntegrityError for a
    constraint) whose ``orig`` is the adapted error, caused by asyncpg's own."""
    adapted = Exception(str(cause))
    adapted.__cause__ = cause
    return kind("INSERT ...", None, adapted)


@pytest.mark.parametrize(
    ("sqlstate", "cls", "kind"),
    [
        ("55P03", asyncpg.exceptions.LockNotAvailableError, "lock_timeout"),
        ("40P01", asyncpg.exceptions.DeadlockDetectedError, "deadlock"),
        ("40001", asyncpg.exceptions.SerializationError, "serialization_failure"),
        ("57014", asyncpg.exceptions.QueryCanceledError, "statement_timeout"),
        ("57P03", asyncpg.exceptions.CannotConnectNowError, "unreachable"),
        ("53300", asyncpg.exceptions.TooManyConnectionsError, "unreachable"),
        ("57P01", asyncpg.exceptions.AdminShutdownError, "unreachable"),
        ("08006", asyncpg.exceptions.ConnectionFailureError, "unreachable"),
    ],
)
def test_each_driver_error_has_one_kind_however_it_is_wrapped(
    sqlstate: str, cls: type[BaseException], kind: str
) -> None:
    raw = _postgres(sqlstate)
    assert type(raw) is cls
    assert failure_kind(raw) == kind
    assert failure_kind(_by_sqlalchemy(raw, sa_exc.DBAPIError)) == kind
    assert classify(_by_sqlalchemy(raw, sa_exc.OperationalError)) == Outage("database", kind)


def test_what_the_database_answered_is_no_failure_kind() -> None:
    for sqlstate in ("23505", "23503", "23514", "22P02", "42P01"):
        raw = _postgres(sqlstate)
        assert failure_kind(raw) is None, sqlstate
        assert failure_kind(_by_sqlalchemy(raw, sa_exc.IntegrityError)) is None, sqlstate


@pytest.mark.parametrize("kind", sorted(CONTENTION_KINDS))
def test_contention_is_aborted_with_retry_info_and_one_reason(kind: str) -> None:
    outage = Outage("database", kind)
    assert outage.contention
    api = outage.api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")
    assert api.retry_after_seconds == 1.0
    assert api.message.endswith("try again")


@pytest.mark.parametrize("kind", ["unreachable", "timeout", "pool_timeout", "statement_timeout"])
def test_outages_are_unavailable_with_retry_info(kind: str) -> None:
    api = Outage("database", kind).api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
    assert api.retry_after_seconds == 1.0
    assert api.metadata == {"dependency": "database"}


def test_a_unique_violation_names_its_constraint() -> None:
    raw = _postgres("23505", constraint_name="uq_remote_claims_token_hash")
    assert type(raw) is asyncpg.exceptions.UniqueViolationError
    assert unique_violation(raw) == "uq_remote_claims_token_hash"
    wrapped = _by_sqlalchemy(raw, sa_exc.IntegrityError)
    assert unique_violation(wrapped) == "uq_remote_claims_token_hash"


def test_other_errors_are_no_unique_violation() -> None:
    assert unique_violation(_postgres("23503", constraint_name="fk_x")) is None  # foreign key
    assert unique_violation(_postgres("23514", constraint_name="ck_x")) is None  # check
    assert unique_violation(_postgres("55P03")) is None
    assert unique_violation(RuntimeError("bug")) is None


def test_an_error_raised_while_handling_a_violation_is_not_one() -> None:
    """A store's domain error raised in its handler (``from None``) is that error, not
    the violation: only what an error wraps counts, not its context."""
    with pytest.raises(LookupError) as caught:
        try:
            raise _postgres("23505", constraint_name="pk_remote_calls")
        except asyncpg.exceptions.UniqueViolationError:
            raise LookupError("the key is taken") from None
    assert caught.value.__context__ is not None
    assert unique_violation(caught.value) is None
    # One raised *from* it wraps it: that one is the violation, named.
    wrapping = LookupError("wrapped")
    wrapping.__cause__ = _postgres("23505", constraint_name="pk_remote_calls")
    assert unique_violation(wrapping) == "pk_remote_calls"


class _Failed(DatabaseFailure):
    """A service's own name for the kit's database failure."""


def test_the_store_boundary_names_outages_and_contention() -> None:
    lock_wait = _by_sqlalchemy(_postgres("55P03"), sa_exc.OperationalError)
    with pytest.raises(_Failed) as caught, database_failures(_Failed):
        raise lock_wait
    failure = caught.value
    assert failure.__cause__ is lock_wait
    assert failure.outage == Outage("database", "lock_timeout")
    # Answered exactly as the server stack answers the driver's own error.
    assert failure.to_api_error() == Outage("database", "lock_timeout").api_error()
    # The outage log line names the database and the kind.
    assert (failure.dependency, failure.cause, failure.reason) == (
        "database",
        "lock_timeout",
        "LOCK_TIMEOUT",
    )

    with pytest.raises(DatabaseFailure) as down, database_failures():
        raise _postgres("57P03")
    assert down.value.to_api_error().code == grpc.StatusCode.UNAVAILABLE
    assert down.value.reason == "DATABASE_UNAVAILABLE"


def test_the_store_boundary_lets_the_rest_pass() -> None:
    violation = _postgres("23505", constraint_name="uq_x")
    with pytest.raises(asyncpg.exceptions.UniqueViolationError), database_failures(_Failed):
        raise violation

    class Named(DomainError):
        pass

    # A domain error caused by an outage was already named by its raiser.
    with pytest.raises(Named), database_failures(_Failed):
        raise Named() from _postgres("57P03")
    with pytest.raises(RuntimeError), database_failures(_Failed):
        raise RuntimeError("bug")


def test_a_call_past_its_deadline_is_a_database_failure() -> None:
    reached = CallDeadlineReached()
    api = reached.to_api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
    assert (reached.dependency, reached.cause) == ("database", "call_deadline")
