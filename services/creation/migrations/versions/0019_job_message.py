"""one job shape: the outbox payload is the full atelier.creation.v1.Job (the message
GetJob answers), built by creation.job_message in sql/job_changes.sql, instead of notify's
JobState built by creation.job_state. Rows already in the outbox keep their JobState
payload (the relay reads both: JobState's keys are Job's).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (as 0018 reads one): a statement ends at a
    line ending in ``;`` outside a ``$$``-quoted body; comment lines never end one."""
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


def upgrade() -> None:
    # The file replaces the trigger functions (now calling job_message) before the old
    # builder goes.
    # Frozen: the live sql/job_changes.sql has moved on (0020).
    for statement in statements((FROZEN / "job_changes_0019.sql").read_text()):
        op.execute(statement)
    op.execute("DROP FUNCTION creation.job_state(creation.jobs)")


def downgrade() -> None:
    for statement in statements((FROZEN / "job_changes_0018.sql").read_text()):
        op.execute(statement)
    op.execute("DROP FUNCTION creation.job_message(creation.jobs)")
