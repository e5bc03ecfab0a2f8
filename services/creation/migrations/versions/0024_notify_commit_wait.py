"""a commit that wakes the relay or the workers waits for PostgreSQL's notification queue
within the statement timeout, not the lock timeout

A transaction that ran pg_notify takes one lock shared by the whole server (every
database) at commit, and holds it while its commit record is flushed; notifying commits
queue on it. That lock is a heavyweight lock, so lock_timeout (1 s: a bound meant for
another request holding the same job or user) ended the queue's slowest waiters: a
cancel on a loaded server answered LOCK_TIMEOUT, "another request holds this", when none
did. The wake-up functions now lift the lock bound for the rest of their transaction
(SET LOCAL) when a statement timeout bounds it instead: a commit stuck behind the queue
ends as any slow statement does, the database unavailable for now (the call's own
deadline still bounds it too). Without a statement timeout the lock bound stays.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (function, channel) of each wake-up: the outbox's (migration 0003) and the queue's (0004).
WAKE_UPS = (("notify_outbox", "creation_outbox"), ("notify_job_queued", "creation_jobs"))


def _function(name: str, channel: str, lifted: bool) -> str:
    lift = (
        """
            IF current_setting('statement_timeout') <> '0' THEN
                PERFORM set_config('lock_timeout', '0', true);
            END IF;"""
        if lifted
        else ""
    )
    return f"""
        CREATE OR REPLACE FUNCTION creation.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN{lift}
            PERFORM pg_notify('{channel}', '');
            RETURN NULL;
        END $$
        """


def upgrade() -> None:
    for name, channel in WAKE_UPS:
        op.execute(_function(name, channel, lifted=True))


def downgrade() -> None:
    for name, channel in WAKE_UPS:
        op.execute(_function(name, channel, lifted=False))
