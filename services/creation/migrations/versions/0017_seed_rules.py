"""what the seeds ask for: a cancelled job gives its daily-quota slot back, one job per
provider request, the adapter's version on the job, and a claim order with no ties

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
MIGRATIONS = Path(__file__).parents[1]

# A provider's request id names one generation: two jobs holding the same one would both
# collect its images (and each cancel the other's). NULL (no request yet) is not a value.
PROVIDER_REQUEST = "uq_jobs_provider_request"
# Claim order: priority, due time, age, then the job id, so jobs made in the same
# microsecond are claimed in one order on every plan.
CLAIM_QUEUE = "ix_jobs_claim_queue"


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (MIGRATIONS / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    # The version of the adapter that submitted the job's current provider request
    # (providers/base.py's Provider.version); NULL until a worker submits. Nullable, no
    # default: adding it rewrites nothing.
    op.add_column("jobs", sa.Column("provider_version", sa.Text()), schema=SCHEMA)
    op.create_index(
        PROVIDER_REQUEST,
        "jobs",
        ["provider_code", "provider_request_id"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("provider_request_id IS NOT NULL"),
    )
    op.drop_index(CLAIM_QUEUE, table_name="jobs", schema=SCHEMA)
    op.create_index(
        CLAIM_QUEUE,
        "jobs",
        [sa.literal_column("priority DESC"), "next_attempt_at", "created_at", "job_id"],
        unique=False,
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'queued'"),
    )
    # The day's count leaves cancelled jobs out (the counts of its submit_job).
    op.execute(frozen_submit_function("0017"))


def downgrade() -> None:
    op.execute(frozen_submit_function("0016"))
    op.drop_index(CLAIM_QUEUE, table_name="jobs", schema=SCHEMA)
    op.create_index(
        CLAIM_QUEUE,
        "jobs",
        [sa.literal_column("priority DESC"), "next_attempt_at", "created_at"],
        unique=False,
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_index(PROVIDER_REQUEST, table_name="jobs", schema=SCHEMA)
    op.drop_column("jobs", "provider_version", schema=SCHEMA)
