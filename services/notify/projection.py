"""The projection: the latest state of every job, moved only forward.

Delivery from creation's outbox is at least once, so the same version arrives again and
versions arrive out of order. :func:`apply` therefore moves a row only to a higher version
(one upsert whose update is gated on it): duplicates and stale versions change nothing and
are not reported as moved.

Every move takes the next value of ``notify.change_seq`` as the row's ``seq``, the cursor
WatchJobs resumes from. A cursor is only safe if a reader that has seen ``seq = n`` can
never later find a committed row with a smaller one; sequence values are handed out when
the statement runs, not when it commits, so concurrent applies would break that. Applies
therefore take one transaction-scoped advisory lock: they commit in the order they drew
their values. Each is one short statement, so this costs little; it also spares concurrent
upserts of the same rows from deadlocking. A Live Activity registration takes the same
lock (:func:`hold_applies`) to read a job's state without missing an apply.

A batch may hold several versions of one job; the row takes the newest, and each move
also carries the versions it passed, since each of them is owed its pushes.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import job_state_pb2
from services.kit.db import fetch

JobState = job_state_pb2.JobState

_TERMINAL = frozenset(
    {
        job_pb2.JOB_STATUS_SUCCEEDED,
        job_pb2.JOB_STATUS_FAILED,
        job_pb2.JOB_STATUS_CANCELLED,
    }
)
_STATUS_PREFIX = "JOB_STATUS_"
_APPLY_LOCK = zlib.crc32(b"atelier-notify-projection-apply")


@dataclass(frozen=True)
class AppliedState:
    """A job's state as the projection holds it, with the ``seq`` its last move drew."""

    state: job_state_pb2.JobState
    seq: int

    @property
    def job_id(self) -> str:
        return self.state.job_id

    @property
    def user_id(self) -> str:
        return self.state.user_id

    @property
    def version(self) -> int:
        return self.state.version


def status_name(state: job_state_pb2.JobState) -> str:
    """creation's name for the state's status (``queued``, ``running``, ...)."""
    return job_pb2.JobStatus.Name(state.status).removeprefix(_STATUS_PREFIX).lower()


def is_terminal(state: job_state_pb2.JobState) -> bool:
    return state.status in _TERMINAL


def newest_per_job(states: Sequence[job_state_pb2.JobState]) -> list[job_state_pb2.JobState]:
    """The highest version of each job among ``states``, ordered by job id (one upsert may
    touch a row only once; a fixed order keeps lock order the same everywhere)."""
    newest: dict[str, job_state_pb2.JobState] = {}
    for state in states:
        held = newest.get(state.job_id)
        if held is None or state.version > held.version:
            newest[state.job_id] = state
    return [newest[job_id] for job_id in sorted(newest)]


@dataclass(frozen=True)
class Moved:
    """A row :func:`apply` moved, with the status it held before (None: a new job) and
    the states of the batch it moved past: newer than the row held, older than where it
    moved to, in version order. The row keeps only the newest, but each of those states
    happened, and push planning owes each its pushes (a job's end followed in the same
    batch by its deletion's tombstone)."""

    applied: AppliedState
    previous_status: str | None
    passed: tuple[job_state_pb2.JobState, ...] = ()

    def steps(self) -> list[tuple[job_state_pb2.JobState, str | None]]:
        """Every state this move went through, oldest first, each with the status the
        job held just before it."""
        steps = []
        before = self.previous_status
        for state in (*self.passed, self.applied.state):
            steps.append((state, before))
            before = status_name(state)
        return steps


# Runs inside apply's transaction, after the upsert, with the rows that moved (push
# planning records its pushes there, so a committed move never lacks them).
InTransaction = Callable[[AsyncConnection, Sequence[Moved]], Awaitable[None]]

_LOCK = text("SELECT pg_advisory_xact_lock(:key)")

# The version gate is the WHERE of the update: a row never moves back, a duplicate never
# moves it at all. user_id is the job's owner and never changes. Rides pk_job_states.
# ``previous`` reads the rows as they were before this statement (its snapshot).
_UPSERT = text(
    """
    WITH previous AS (
        SELECT job_id, status, version FROM notify.job_states
        WHERE job_id = ANY(CAST(:job_ids AS uuid[]))
    )
    INSERT INTO notify.job_states AS current
        (job_id, user_id, version, status, terminal, state, updated_at)
    SELECT job_id, user_id, version, status, terminal, state, now()
    FROM unnest(
        CAST(:job_ids AS uuid[]), CAST(:user_ids AS text[]), CAST(:versions AS bigint[]),
        CAST(:statuses AS text[]), CAST(:terminals AS boolean[]), CAST(:states AS bytea[])
    ) AS delivered(job_id, user_id, version, status, terminal, state)
    ON CONFLICT (job_id) DO UPDATE SET
        version = EXCLUDED.version,
        status = EXCLUDED.status,
        terminal = EXCLUDED.terminal,
        state = EXCLUDED.state,
        updated_at = EXCLUDED.updated_at,
        seq = nextval('notify.change_seq')
    WHERE current.version < EXCLUDED.version
    RETURNING job_id, seq,
        (SELECT p.status FROM previous p WHERE p.job_id = current.job_id) AS previous_status,
        (SELECT p.version FROM previous p WHERE p.job_id = current.job_id) AS previous_version
    """
)


async def hold_applies(connection: AsyncConnection) -> None:
    """Waits for the applies in flight and keeps new ones out until this transaction
    ends. A Live Activity registration holds it while it reads the job's state and
    stores its token: an apply then either committed before (the registration sees its
    state) or runs after (it sees the token), never neither."""
    await connection.execute(_LOCK, {"key": _APPLY_LOCK})


async def apply(
    engine: AsyncEngine,
    states: Sequence[job_state_pb2.JobState],
    in_transaction: InTransaction | None = None,
) -> list[AppliedState]:
    """Applies ``states`` (any order, duplicates welcome) in one transaction; returns the
    rows that moved, in ``seq`` order, each with the state it moved to. ``in_transaction``
    runs before the commit with what moved (not called when nothing did)."""
    newest = newest_per_job(states)
    if not newest:
        return []
    parameters = {
        "job_ids": [s.job_id for s in newest],
        "user_ids": [s.user_id for s in newest],
        "versions": [s.version for s in newest],
        "statuses": [status_name(s) for s in newest],
        "terminals": [is_terminal(s) for s in newest],
        "states": [s.SerializeToString() for s in newest],
    }
    async with engine.begin() as connection:
        await hold_applies(connection)
        rows = (await connection.execute(_UPSERT, parameters)).all()
        per_job = _versions_per_job(states)
        moved = sorted(
            (_moved(row, per_job[str(row.job_id)]) for row in rows),
            key=lambda change: change.applied.seq,
        )
        if moved and in_transaction is not None:
            await in_transaction(connection, moved)
    return [change.applied for change in moved]


def _versions_per_job(
    states: Sequence[job_state_pb2.JobState],
) -> dict[str, dict[int, job_state_pb2.JobState]]:
    """Each job's states in ``states``, one per version (a duplicate is the same state)."""
    per_job: dict[str, dict[int, job_state_pb2.JobState]] = {}
    for state in states:
        per_job.setdefault(state.job_id, {})[state.version] = state
    return per_job


def _moved(row: Row[Any], versions: dict[int, job_state_pb2.JobState]) -> Moved:
    """The move of one upserted row: to its job's newest state, past the batch's states
    between the version the row held (none: a new job) and that one."""
    ordered = sorted(versions)
    held = row.previous_version or 0
    return Moved(
        AppliedState(versions[ordered[-1]], int(row.seq)),
        row.previous_status,
        tuple(versions[v] for v in ordered[:-1] if v > held),
    )


def _stored(state: bytes, seq: int) -> AppliedState:
    return AppliedState(job_state_pb2.JobState.FromString(state), int(seq))


# Rides pk_job_states.
_LATEST = text(
    "SELECT state, seq FROM notify.job_states WHERE job_id = ANY(CAST(:job_ids AS uuid[]))"
)
# Rides ix_job_states_user_id_seq.
_CHANGED_SINCE = text(
    """
    SELECT state, seq FROM notify.job_states
    WHERE user_id = ANY(CAST(:user_ids AS text[])) AND seq > :seq
    ORDER BY seq
    """
)


async def latest(engine: AsyncEngine, job_ids: Sequence[str]) -> list[AppliedState]:
    """The projected state of each of ``job_ids`` that notify has heard of (one query)."""
    if not job_ids:
        return []
    rows = await fetch(engine, _LATEST, {"job_ids": list(job_ids)})
    return [_stored(row.state, row.seq) for row in rows]


async def changed_since(
    engine: AsyncEngine, user_ids: Sequence[str], seq: int
) -> list[AppliedState]:
    """Every job of ``user_ids`` whose row moved after cursor ``seq``, in ``seq`` order
    (one query)."""
    if not user_ids:
        return []
    rows = await fetch(engine, _CHANGED_SINCE, {"user_ids": list(user_ids), "seq": seq})
    return [_stored(row.state, row.seq) for row in rows]
