"""acting for a user: a change a service identity makes for a job's owner
(atelier-on-behalf-of) names that identity, on the row (jobs.change_via, set by the
writer like the other change_* columns; the submit function takes it as p_via) and on
the user's event the triggers write (job_events.via, sql/job_changes.sql). Other actors'
events never carry it. Nullable, no default: adding them rewrites nothing.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

OLD_SUBMIT = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, timestamptz, integer, text)"
)
NEW_SUBMIT = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, timestamptz, integer, text,"
    " text)"
)


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (0018's reader, copied: a migration imports
    nothing, not even another migration)."""
    found: list[str] = []
    lines: list[str] = []
    quoted = False
    for line in script.splitlines():
        lines.append(line)
        code = line.strip()
        if code.startswith("--"):
            continue
        quoted ^= code.count("$$") % 2 == 1
        if not quoted and code.endswith(";"):
            found.append("\n".join(lines).strip())
            lines = []
    if quoted or any(line.strip() and not line.strip().startswith("--") for line in lines):
        raise ValueError("the script ends inside a statement (a missing ';' or '$$')")
    return found


def _load(path: Path) -> None:
    for statement in statements(path.read_text()):
        op.execute(statement)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("change_via", sa.Text()), schema=SCHEMA)
    op.add_column("job_events", sa.Column("via", sa.Text()), schema=SCHEMA)
    op.execute(f"DROP FUNCTION {OLD_SUBMIT}")
    op.execute((CREATION / "sql" / "submit_job.sql").read_text())
    # Frozen: the live sql/job_changes.sql has moved on (0027).
    _load(FROZEN / "job_changes_0025.sql")


def downgrade() -> None:
    _load(FROZEN / "job_changes_0023.sql")
    op.execute(f"DROP FUNCTION {NEW_SUBMIT}")
    op.execute((FROZEN / "submit_job_0018.sql").read_text())
    op.drop_column("job_events", "via", schema=SCHEMA)
    op.drop_column("jobs", "change_via", schema=SCHEMA)
