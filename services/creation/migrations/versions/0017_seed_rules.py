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
    # The day's count leaves cancelled jobs out (sql/submit_job.sql's counts).
    op.execute((MIGRATIONS.parent / "sql" / "submit_job.sql").read_text())


def downgrade() -> None:
    op.execute((MIGRATIONS / "frozen" / "submit_job_0016.sql").read_text())
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
