"""jobs.trace_parent: the W3C traceparent of the submit that made the job, so the worker's
attempts and the relay's deliveries join the submit's trace; creation.submit_job takes it

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The signature 0007 made; this one adds p_trace_parent text at the end. A new argument
# is a new signature (CREATE OR REPLACE cannot add one), so the old function is dropped.
OLD_SIGNATURE = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, jsonb, timestamptz, integer)"
)
SIGNATURE = OLD_SIGNATURE[:-1] + ", text)"


# This revision's function (frozen/submit_job_0008.sql) is 0007's with one change:
# p_trace_parent, written into the new job row.


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing. NULL: the submit was not traced.
    op.add_column("jobs", sa.Column("trace_parent", sa.Text()), schema="creation")
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(frozen_submit_function("0008"))


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.drop_column("jobs", "trace_parent", schema="creation")
    op.execute(frozen_submit_function("0007"))
