"""creation.submit_job is loaded from services/creation/sql/submit_job.sql, the rules as
they run (the same text 0015 made)

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

# The submit rules as they run now: the file is their one home (a later change copies it
# to migrations/frozen/submit_job_0016.sql and points this revision there).
SUBMIT_FUNCTION = Path(__file__).parents[2] / "sql" / "submit_job.sql"


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    op.execute(SUBMIT_FUNCTION.read_text())


def downgrade() -> None:
    op.execute(frozen_submit_function("0015"))
