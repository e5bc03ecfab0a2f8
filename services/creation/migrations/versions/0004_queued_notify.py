"""wake workers when a job becomes queued

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A job that becomes queued (submitted, retried, handed back, reaped, or queued again by
# an operator) wakes the workers (LISTEN creation_jobs) at commit, from the database
# itself: no writer can forget to. Row triggers with a WHEN clause cost nothing on the
# hot updates that leave the status alone (beats, completions); PostgreSQL folds equal
# notifications of one transaction into one.


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION creation.notify_job_queued() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('creation_jobs', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER jobs_queued_insert AFTER INSERT ON creation.jobs"
        " FOR EACH ROW WHEN (NEW.status = 'queued')"
        " EXECUTE FUNCTION creation.notify_job_queued()"
    )
    op.execute(
        "CREATE TRIGGER jobs_queued_update AFTER UPDATE OF status ON creation.jobs"
        " FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status <> 'queued')"
        " EXECUTE FUNCTION creation.notify_job_queued()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_queued_update ON creation.jobs")
    op.execute("DROP TRIGGER jobs_queued_insert ON creation.jobs")
    op.execute("DROP FUNCTION creation.notify_job_queued()")
