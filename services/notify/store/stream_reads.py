"""The streams' reads of the projection (notify.job_states), each a named statement with
the index it rides: a WatchJob's first state, a WatchJobs snapshot, the backstop's pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from atelier.creation.v1 import job_pb2
from services.kit.db import fetch, read
from services.notify.store.boundary import database
from services.notify.streams.change import Change, Snapshot
from services.notify.streams.registry import Watched

# The first state of the WatchJob streams that opened together. Primary key.
LATEST_OF_JOBS = text(
    "SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state"
    " FROM notify.job_states s WHERE s.job_id = ANY(CAST(:job_ids AS uuid[]))"
)

# A WatchJobs snapshot: the user's unfinished jobs plus every job changed after the cursor,
# oldest cursor first. Index (user_id, seq).
USER_SNAPSHOT = text(
    "SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state FROM notify.job_states s"
    " WHERE s.user_id = :user_id AND (NOT s.terminal OR s.seq > :after_seq)"
    " ORDER BY s.seq LIMIT :limit"
)

# Where a fresh WatchJobs stream's cursor starts: the user's latest change. Index
# (user_id, seq), backwards.
USER_LATEST_SEQ = text(
    "SELECT coalesce(max(s.seq), 0) FROM notify.job_states s WHERE s.user_id = :user_id"
)

# The backstop: in one statement, every watched job's versions above what local streams
# have, and every watched user's changes above their lowest cursor. Primary key and
# index (user_id, seq).
MISSED = text(
    "SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state FROM notify.job_states s"
    " JOIN unnest(CAST(:job_ids AS uuid[]), CAST(:versions AS bigint[])) AS w(job_id, version)"
    " ON s.job_id = w.job_id AND s.version > w.version"
    " UNION ALL"
    " SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state FROM notify.job_states s"
    " JOIN unnest(CAST(:user_ids AS text[]), CAST(:seqs AS bigint[])) AS u(user_id, seq)"
    " ON s.user_id = u.user_id AND s.seq > u.seq"
)


def _change(row: Row[Any]) -> Change:
    state = job_pb2.Job.FromString(row.state)
    return Change.of(state, seq=row.seq, terminal=row.terminal)


class StreamReads:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def latest_of_jobs(self, job_ids: list[str]) -> dict[str, Change]:
        rows = await fetch(self._engine, LATEST_OF_JOBS, {"job_ids": job_ids})
        return {row.job_id: _change(row) for row in rows}

    @database
    async def user_snapshot(self, user_id: str, after_seq: int | None, limit: int) -> Snapshot:
        """The snapshot of a WatchJobs stream; ``after_seq`` None starts afresh (unfinished
        jobs only, cursor at the user's latest change)."""

        async def run(connection: AsyncConnection) -> Snapshot:
            latest = (await connection.execute(USER_LATEST_SEQ, {"user_id": user_id})).scalar_one()
            if after_seq is not None and after_seq > latest:
                return Snapshot(changes=[], cursor=latest, expired=False, ahead=True)
            rows = (
                await connection.execute(
                    USER_SNAPSHOT,
                    {
                        "user_id": user_id,
                        "after_seq": latest if after_seq is None else after_seq,
                        "limit": limit + 1,
                    },
                )
            ).all()
            changes = [_change(row) for row in rows[:limit]]
            expired = len(rows) > limit
            if expired and after_seq is None:
                # Afresh, only unfinished jobs are sent: keep the most recently changed.
                changes = [_change(row) for row in rows[-limit:]]
                expired = False
            start = latest if after_seq is None else after_seq
            return Snapshot(
                changes=changes,
                cursor=max([start, *(c.seq for c in changes)]),
                expired=expired,
            )

        return await read(self._engine, run)

    @database
    async def missed(self, watched: Watched) -> Sequence[Change]:
        """What local streams may have missed (the backstop's one query per period)."""
        if not watched.jobs and not watched.users:
            return []
        rows = await fetch(
            self._engine,
            MISSED,
            {
                "job_ids": list(watched.jobs),
                "versions": list(watched.jobs.values()),
                "user_ids": list(watched.users),
                "seqs": list(watched.users.values()),
            },
        )
        return [_change(row) for row in rows]
