"""outbox rows record what changed, not a copy of it: a job change's outbox row names the
job, its new version and the event type; the relay builds the job's message when it
delivers, from the job's row as it is then, once per job per round (superseded versions
of a job in one round coalesce: every consumer is version-gated). Only a row marked
webhooks_pending still carries the job's message as of its version in payload (each
webhook event is the job as of its own change); an unmarked row's payload is NULL
(sql/job_changes.sql). Building the message on the job's path cost ~10 % of
PostgreSQL's CPU per drained job (issue 9's A/B).

Rows already in the outbox keep their payloads (the relay reads the job's row instead).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-03
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"


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
    op.alter_column("outbox", "payload", nullable=True, schema=SCHEMA)
    # Frozen: the live sql/job_changes.sql has moved on (0031).
    _load(FROZEN / "job_changes_0030.sql")


def downgrade() -> None:
    # 0029's relay reads every row's payload: a row without one gets its job's message as
    # the job stands now (for an undelivered row, what this revision's relay would send).
    op.execute(
        """
        UPDATE creation.outbox AS o SET payload = creation.job_message(j)
        FROM creation.jobs AS j
        WHERE o.payload IS NULL AND j.job_id = o.job_id
        """
    )
    op.alter_column("outbox", "payload", nullable=False, schema=SCHEMA)
    _load(FROZEN / "job_changes_0029.sql")
