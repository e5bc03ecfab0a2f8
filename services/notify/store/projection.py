"""The projection's statements (notify.job_states): the version-gated upsert of a Deliver
and the reads by job and by user's cursor.

Every move takes the next value of ``notify.change_seq`` as the row's ``seq``, the cursor
WatchJobs resumes from. A cursor is only safe if a reader that has seen ``seq = n`` can
never later find a committed row with a smaller one; sequence values are handed out when
the statement runs, not when it commits, so concurrent applies would break that. Applies
therefore take one transaction-scoped advisory lock: they commit in the order they drew
their values. Each is one short statement, so this costs little; it also spares concurrent
upserts of the same rows from deadlocking. A Live Activity registration takes the same
lock (:func:`hold_applies`) to read a job's state without missing an apply.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from atelier.creation.v1 import job_pb2
from services.kit.db import fetch
from services.notify import projection
from services.notify.projection import AppliedState, is_terminal, status_name
from services.notify.pushes.planner import PushPlanner
from services.notify.store import pushes
from services.notify.store.boundary import database

_APPLY_LOCK = zlib.crc32(b"atelier-notify-projection-apply")
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


async def hold_applies(connection: AsyncConnection) -> None:
    """Waits for the applies in flight and keeps new ones out until this transaction
    ends. A Live Activity registration holds it while it reads the job's state and
    stores its token: an apply then either committed before (the registration sees its
    state) or runs after (it sees the token), never neither."""
    await connection.execute(_LOCK, {"key": _APPLY_LOCK})


def _stored(state: bytes, seq: int) -> AppliedState:
    return AppliedState(job_pb2.Job.FromString(state), int(seq))


class ProjectionStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def apply(
        self, states: Sequence[job_pb2.Job], planner: PushPlanner | None = None
    ) -> list[AppliedState]:
        """Applies ``states`` (any order, duplicates welcome) in one transaction; returns
        the rows that moved, in ``seq`` order, each with the state it moved to. With a
        ``planner``, the pushes what moved implies are recorded before the commit (so a
        committed move never lacks them, and a replay, which moves nothing, adds none)."""
        newest = projection.newest_per_job(states)
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
        async with self._engine.begin() as connection:
            await hold_applies(connection)
            rows = (await connection.execute(_UPSERT, parameters)).all()
            per_job = projection.versions_per_job(states)
            moved = sorted(
                (
                    projection.moved(
                        int(row.seq),
                        row.previous_status,
                        row.previous_version,
                        per_job[str(row.job_id)],
                    )
                    for row in rows
                ),
                key=lambda change: change.applied.seq,
            )
            if moved and planner is not None:
                await pushes.record_moves(connection, moved, planner)
        return [change.applied for change in moved]

    @database
    async def latest(self, job_ids: Sequence[str]) -> list[AppliedState]:
        """The projected state of each of ``job_ids`` that notify has heard of (one
        query)."""
        if not job_ids:
            return []
        rows = await fetch(self._engine, _LATEST, {"job_ids": list(job_ids)})
        return [_stored(row.state, row.seq) for row in rows]

    @database
    async def changed_since(self, user_ids: Sequence[str], seq: int) -> list[AppliedState]:
        """Every job of ``user_ids`` whose row moved after cursor ``seq``, in ``seq`` order
        (one query)."""
        if not user_ids:
            return []
        rows = await fetch(self._engine, _CHANGED_SINCE, {"user_ids": list(user_ids), "seq": seq})
        return [_stored(row.state, row.seq) for row in rows]
