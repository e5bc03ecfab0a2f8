"""SubmitJob in one call: the user's lock and the submit statement in a function

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One round trip for a submit instead of four (BEGIN, the lock, the statement, COMMIT):
# the call runs in its own implicit transaction, which holds the user's lock until it
# commits. PL/pgSQL keeps each statement's plan for the session (a SQL-language function
# is planned on every call), and in a VOLATILE function each statement takes a new
# snapshot under READ COMMITTED, so the statement after the lock sees every submit that
# held the lock before it. The lock wait sits in a block of its own so that its timeout
# is told apart (DETAIL creation.user_lock) from any other lock wait.
#
# The verdicts, in the order the rules apply (the order of the errors clients see):
# replay (the idempotency key already made a job: that job comes back, whatever else
# holds now), model_not_available, style_not_available, style_model_mismatch,
# daily_quota_exceeded, in_flight_limit_reached, insufficient_points, ok. Each insert
# runs only on ok; the foreign keys of the side rows are checked at the end of the
# statement, after the job row exists. The job comes back whole, as a creation.jobs row.
#
# The function's text is migrations/frozen/submit_job_0007.sql; the rules as they run
# now are services/creation/sql/submit_job.sql.

SIGNATURE = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, jsonb, timestamptz, integer)"
)


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    op.execute(frozen_submit_function("0007"))


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
