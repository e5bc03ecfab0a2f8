"""The job feed's reads of the projection (notify.job_states): where a WatchAllJobs stream
starts, and its pages of changes after a cursor, each a named statement with the index it
rides.

The cursor is the projection's ``seq``: one sequence for every job, and applies commit in
the order they drew it (store/projection.py), so a reader that has read every row up to
``seq = n`` can never later find a committed row at or below it. A row's ``seq`` moves each
time the job does, so the rows after a cursor are exactly the jobs that changed since, each
at its latest version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from atelier.creation.v1 import job_pb2
from services.kit.db import fetch, read
from services.notify.store.boundary import database
from services.notify.streams.change import Change

# The latest change of all. Index ix_job_states_seq, backwards (one entry).
LATEST_SEQ = text("SELECT coalesce(max(s.seq), 0) FROM notify.job_states s")

# How many jobs changed after a cursor, counted up to a bound (never the whole table).
# Index ix_job_states_seq (an index-only range scan of at most :limit entries).
CHANGED_SINCE_COUNT = text(
    "SELECT count(*) FROM (SELECT 1 FROM notify.job_states s WHERE s.seq > :seq"
    " ORDER BY s.seq LIMIT :limit) AS since"
)

# A page of every job changed after a cursor, oldest change first. Index ix_job_states_seq.
PAGE = text(
    "SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state FROM notify.job_states s"
    " WHERE s.seq > :seq ORDER BY s.seq LIMIT :limit"
)

# The same for some users only: each user's next rows, then the oldest of them. Index
# ix_job_states_user_id_seq, once per user.
PAGE_OF_USERS = text(
    "SELECT c.job_id, c.seq, c.terminal, c.state"
    " FROM unnest(CAST(:user_ids AS text[])) AS u(user_id)"
    " CROSS JOIN LATERAL ("
    "   SELECT s.job_id::text AS job_id, s.seq, s.terminal, s.state FROM notify.job_states s"
    "   WHERE s.user_id = u.user_id AND s.seq > :seq ORDER BY s.seq LIMIT :limit"
    " ) AS c"
    " ORDER BY c.seq LIMIT :limit"
)


@dataclass(frozen=True)
class FeedStart:
    """Where the projection stands when a stream opens."""

    # The latest change's cursor (0: nothing applied yet).
    latest: int
    # More jobs changed after the requested cursor than a replay holds.
    too_many_since: bool


@dataclass(frozen=True)
class FeedPage:
    """The rows after a cursor, oldest first; ``last_seq``: the cursor of the last one
    (the given cursor when there were none)."""

    changes: list[Change]
    last_seq: int
    full: bool


def _change(row: Row[Any]) -> Change:
    return Change.of(job_pb2.Job.FromString(row.state), seq=row.seq, terminal=row.terminal)


class FeedReads:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def start(self, after_seq: int | None, replay_limit: int) -> FeedStart:
        """The latest cursor, and (for a resume after ``after_seq``) whether more than
        ``replay_limit`` jobs changed since."""

        async def run(connection: AsyncConnection) -> FeedStart:
            latest = int((await connection.execute(LATEST_SEQ)).scalar_one())
            if after_seq is None or after_seq >= latest:
                return FeedStart(latest=latest, too_many_since=False)
            changed = (
                await connection.execute(
                    CHANGED_SINCE_COUNT, {"seq": after_seq, "limit": replay_limit + 1}
                )
            ).scalar_one()
            return FeedStart(latest=latest, too_many_since=int(changed) > replay_limit)

        return await read(self._engine, run)

    @database
    async def page(self, after_seq: int, user_ids: Sequence[str], limit: int) -> FeedPage:
        """Up to ``limit`` jobs changed after ``after_seq`` (of ``user_ids`` only, when
        given), oldest change first."""
        if user_ids:
            rows = await fetch(
                self._engine,
                PAGE_OF_USERS,
                {"user_ids": list(user_ids), "seq": after_seq, "limit": limit},
            )
        else:
            rows = await fetch(self._engine, PAGE, {"seq": after_seq, "limit": limit})
        changes = [_change(row) for row in rows]
        last = changes[-1].seq if changes else after_seq
        return FeedPage(changes=changes, last_seq=last, full=len(changes) >= limit)
