"""notify's push tables as agreed with the push-queue work (migration 0003_pushes.py owns
them). Until that migration lands, tests create them here; ``IF NOT EXISTS`` makes this a
no-op once it has."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

PUSH_TABLES = """
CREATE TABLE IF NOT EXISTS notify.push_tokens (
    token_id uuid PRIMARY KEY,
    user_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('device', 'activity', 'push_to_start')),
    token text NOT NULL,
    environment text NOT NULL CHECK (environment IN ('sandbox', 'production')),
    bundle_id text NOT NULL,
    locale text NOT NULL,
    job_id uuid NULL,
    activity_id text NULL,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired', 'bad')),
    status_reason text NULL,
    registered_at timestamptz NOT NULL,
    retired_at timestamptz NULL
);
CREATE TABLE IF NOT EXISTS notify.pushes (
    push_id bigserial PRIMARY KEY,
    token_id uuid NOT NULL REFERENCES notify.push_tokens (token_id),
    job_id uuid NOT NULL,
    version bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('alert', 'la_start', 'la_update', 'la_end')),
    priority int NOT NULL,
    expires_at timestamptz NULL,
    collapse_id text NULL,
    headers jsonb NOT NULL,
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'sent', 'failed', 'dropped')),
    attempts int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    apns_id text NULL,
    last_http_status int NULL,
    last_reason text NULL,
    created_at timestamptz NOT NULL,
    sent_at timestamptz NULL,
    UNIQUE (token_id, job_id, version, kind)
);
CREATE INDEX IF NOT EXISTS ix_pushes_pending_next_attempt_at
    ON notify.pushes (next_attempt_at) WHERE status = 'pending';
CREATE TABLE IF NOT EXISTS notify.push_attempts (
    push_id bigint NOT NULL,
    attempt int NOT NULL,
    apns_id text NULL,
    http_status int NULL,
    reason text NULL,
    at timestamptz NOT NULL
);
"""


async def create_push_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        for statement in PUSH_TABLES.split(";"):
            if statement.strip():
                await connection.execute(text(statement))


async def empty_push_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text("TRUNCATE notify.push_attempts, notify.pushes, notify.push_tokens")
        )
