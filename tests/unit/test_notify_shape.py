"""notify in the shape of every service: its SQL only in its store, its errors in one
table (each answering one status and a stable reason), and Deliver's steps in a service
layer whose publisher cannot fail a batch that committed."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.kit.errors import DomainError
from services.kit.outages import Outage
from services.notify import errors
from services.notify.delivery import Delivery
from services.notify.projection import AppliedState, Job
from tests.support.notify import job_state, new_job_id

NOTIFY = Path(__file__).resolve().parents[2] / "services" / "notify"
# The schema and its history describe tables; they run no statement of the service's.
_NOT_THE_STORE = ("tables.py", "migrations")
# A type to pass an engine along (the app assembles the stores from it) is no statement.
_ALLOWED = {"sqlalchemy.ext.asyncio"}


def _database_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            root = name.split(".")[0]
            if root in ("sqlalchemy", "asyncpg") and name not in _ALLOWED:
                found.append(f"{path.relative_to(NOTIFY)}:{node.lineno} imports {name}")
    return found


def test_only_the_store_talks_to_the_database() -> None:
    outside = [
        problem
        for path in sorted(NOTIFY.rglob("*.py"))
        if path.relative_to(NOTIFY).parts[0] not in ("store", *_NOT_THE_STORE)
        for problem in _database_imports(path)
    ]
    assert not outside, "\n".join(outside)


def test_reasons_are_declared_once() -> None:
    declared = [
        str(path.relative_to(NOTIFY))
        for path in NOTIFY.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Reason"
    ]
    assert declared == ["errors.py"]


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (errors.DeviceNotFound("d"), grpc.StatusCode.NOT_FOUND, "DEVICE_NOT_FOUND"),
        (errors.JobNotFound("j"), grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND"),
        (
            errors.LiveActivityNotFound("j", "a"),
            grpc.StatusCode.NOT_FOUND,
            "LIVE_ACTIVITY_NOT_FOUND",
        ),
        (errors.CursorExpired("why"), grpc.StatusCode.FAILED_PRECONDITION, "CURSOR_EXPIRED"),
        (
            errors.DatabaseFailed(Outage("database", "unreachable")),
            grpc.StatusCode.UNAVAILABLE,
            "DATABASE_UNAVAILABLE",
        ),
        (
            errors.DatabaseFailed(Outage("database", "lock_timeout")),
            grpc.StatusCode.ABORTED,
            "LOCK_TIMEOUT",
        ),
    ],
)
def test_each_domain_error_answers_one_status_and_reason(
    error: DomainError, code: grpc.StatusCode, reason: str
) -> None:
    answer = error.to_api_error()
    assert (answer.code, answer.reason) == (code, reason)


def test_an_expired_cursor_says_why_and_what_to_do() -> None:
    answer = errors.CursorExpired("too much changed since this cursor").to_api_error()
    assert answer.message == (
        "too much changed since this cursor: watch afresh without a cursor and list the jobs"
    )


class _Projection:
    """Moves every state it is given (a fake of store.ProjectionStore.apply)."""

    async def apply(self, states: Sequence[Job], planner: Any = None) -> list[AppliedState]:
        return [AppliedState(state, seq) for seq, state in enumerate(states, start=1)]


class _BrokenPublisher:
    calls = 0

    async def publish(self, applied: Sequence[AppliedState]) -> None:
        self.calls += 1
        raise ConnectionError("redis is away")


async def test_a_failed_publish_does_not_fail_a_committed_delivery() -> None:
    publisher = _BrokenPublisher()
    delivery = Delivery(_Projection(), publisher)  # type: ignore[arg-type]
    states = [job_state(new_job_id(), 1), job_state(new_job_id(), 2)]
    applied = await delivery.deliver(states)
    assert [a.state for a in applied] == states
    assert publisher.calls == 1
