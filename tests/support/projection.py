"""The projection's table as the streams read it, and a stand-in for Deliver's apply, so
the stream tests drive real rows without the ingest side.

The table is notify-ingest's (migration 0002_projection): this creates it only where the
migrations have not, with the agreed columns and index.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2

DDL = [
    "CREATE SCHEMA IF NOT EXISTS notify",
    "CREATE SEQUENCE IF NOT EXISTS notify.change_seq",
    "CREATE TABLE IF NOT EXISTS notify.job_states ("
    " job_id uuid PRIMARY KEY, user_id text NOT NULL, version bigint NOT NULL,"
    " status text NOT NULL, terminal boolean NOT NULL, state bytea NOT NULL,"
    " seq bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())",
    "CREATE INDEX IF NOT EXISTS ix_job_states_user_id_seq ON notify.job_states (user_id, seq)",
]

TERMINAL = {
    job_pb2.JOB_STATUS_SUCCEEDED,
    job_pb2.JOB_STATUS_FAILED,
    job_pb2.JOB_STATUS_CANCELLED,
}

# Version-gated upsert: an older or equal version changes nothing (returns no row).
APPLY = text(
    "INSERT INTO notify.job_states AS s"
    " (job_id, user_id, version, status, terminal, state, seq, updated_at)"
    " VALUES (:job_id, :user_id, :version, :status, :terminal, :state,"
    " nextval('notify.change_seq'), now())"
    " ON CONFLICT (job_id) DO UPDATE SET version = excluded.version,"
    " status = excluded.status, terminal = excluded.terminal, state = excluded.state,"
    " seq = nextval('notify.change_seq'), updated_at = now()"
    " WHERE s.version < excluded.version"
    " RETURNING seq"
)


@dataclass(frozen=True)
class Applied:
    """What the projection's apply returns (AppliedState: the state and its seq)."""

    state: job_pb2.Job
    seq: int


async def ensure_table(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        for statement in DDL:
            await connection.execute(text(statement))


def job_state(
    job_id: str, user_id: str, version: int, status: int, progress: int = 0
) -> job_pb2.Job:
    return job_pb2.Job(
        job_id=job_id,
        user_id=user_id,
        version=version,
        status=status,  # type: ignore[arg-type]
        progress_percent=progress,
    )


async def apply(engine: AsyncEngine, states: list[job_pb2.Job]) -> list[Applied]:
    """Applies each state whose version is newer, in one transaction; returns those."""
    applied = []
    async with engine.begin() as connection:
        for state in states:
            terminal = state.status in TERMINAL
            seq = (
                await connection.execute(
                    APPLY,
                    {
                        "job_id": state.job_id,
                        "user_id": state.user_id,
                        "version": state.version,
                        # creation's name for it, as the projection stores it.
                        "status": job_pb2.JobStatus.Name(state.status)
                        .removeprefix("JOB_STATUS_")
                        .lower(),
                        "terminal": terminal,
                        "state": state.SerializeToString(),
                    },
                )
            ).scalar_one_or_none()
            if seq is not None:
                applied.append(Applied(state=state, seq=seq))
    return applied
