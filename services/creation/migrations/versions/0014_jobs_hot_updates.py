"""jobs take heap-only (HOT) updates: the operators' queue index no longer keys on
updated_at, which every write of a job sets, and the table's pages keep room for a job's
next version

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

# PostgreSQL writes a new version of a row into the same page, without touching any index
# (a HOT update), only when no indexed column changed and the page has room. Every write
# of a job sets updated_at, so an index keyed on it (ix_jobs_needs_attention, until now)
# made every one of a job's four to six versions add an entry to each of the table's
# indexes. Keyed on job_id instead, the worker's step markers (SUBMITTING, the request id,
# progress) change no indexed column; the operators' queue is small, and its query sorts
# it by updated_at itself.
#
# fillfactor 70: a job is written a few times soon after it is inserted, so its page keeps
# room for those versions. ALTER TABLE ... SET changes only pages written from now on.
FILLFACTOR = 70


def upgrade() -> None:
    op.drop_index("ix_jobs_needs_attention", table_name="jobs", schema=SCHEMA)
    op.execute(
        "CREATE INDEX ix_jobs_needs_attention ON creation.jobs (job_id)"
        " WHERE status = 'needs_attention'"
    )
    op.execute(f"ALTER TABLE creation.jobs SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    op.execute("ALTER TABLE creation.jobs RESET (fillfactor)")
    op.drop_index("ix_jobs_needs_attention", table_name="jobs", schema=SCHEMA)
    op.execute(
        "CREATE INDEX ix_jobs_needs_attention ON creation.jobs (updated_at, job_id)"
        " WHERE status = 'needs_attention'"
    )
