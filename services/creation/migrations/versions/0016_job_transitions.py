"""the database refuses a job status change the state machine lacks (a trigger naming
illegal_job_transition); creation.submit_job is loaded from services/creation/sql

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The CHECKs judge one row's shape; this judges the step between two rows. Every status
# change the state machine has (DESIGN.md; services/creation/domain.py TRANSITIONS), as
# (from, to). A status left alone (heartbeats, step markers, a cancel request, a deletion,
# an output purge) is no change; inserts are not judged (a submit makes a queued job).
LEGAL = (
    ("queued", "running"),  # a worker claims it
    ("queued", "cancelled"),  # CancelJob
    ("running", "succeeded"),  # the worker completes it
    ("running", "queued"),  # retry, hand back, the reaper's retry or resume
    ("running", "failed"),  # no attempts left, a final error, the reaper
    ("running", "cancelled"),  # the worker acknowledges a cancel, the reaper
    ("running", "needs_attention"),  # the provider's outcome is unknown
    ("needs_attention", "queued"),  # an operator retries it
    ("needs_attention", "failed"),  # an operator fails it
    ("needs_attention", "cancelled"),  # an operator cancels it
)
_PAIRS = ", ".join(f"('{source}', '{target}')" for source, target in LEGAL)

# Only an illegal change calls the function: the WHEN clause holds the table, and an AFTER
# row trigger whose WHEN is false queues nothing, so a legal write pays for a comparison
# (as 0004's and 0006's triggers do). Not BEFORE: for a BEFORE row trigger PostgreSQL
# fetches and locks the old row again before it looks at columns or WHEN, for every row
# an UPDATE of jobs writes, status changed or not. After the CHECKs, so a row that is no
# whole state is still refused by its ck_jobs_* name. The error is a check_violation
# naming the constraint illegal_job_transition, as a CHECK would: stores recognise it by
# that name; the statement, and its transaction, is undone.
REFUSE_FUNCTION = """
CREATE FUNCTION creation.refuse_job_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'illegal_job_transition: job % cannot go from % to %',
      OLD.job_id, OLD.status, NEW.status
    USING ERRCODE = 'check_violation', CONSTRAINT = 'illegal_job_transition',
          SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = 'status';
END
$$
"""
TRIGGER = f"""
CREATE TRIGGER jobs_transition_legal AFTER UPDATE OF status ON creation.jobs
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status AND (OLD.status, NEW.status) NOT IN ({_PAIRS}))
EXECUTE FUNCTION creation.refuse_job_transition()
"""


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    op.execute(REFUSE_FUNCTION)
    op.execute(TRIGGER)
    op.execute(frozen_submit_function("0016"))


def downgrade() -> None:
    op.execute(frozen_submit_function("0015"))
    op.execute("DROP TRIGGER jobs_transition_legal ON creation.jobs")
    op.execute("DROP FUNCTION creation.refuse_job_transition()")
