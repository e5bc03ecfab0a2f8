"""webhook deliveries carry the job as it stands when the deliverers fan its change out,
not a copy taken on the job's path: a marked outbox row records what changed (job,
version, event type, model) and nothing more, like every other row since 0030, and
creation.fan_out_webhooks builds each job's message from its row, once per job per batch
(sql/job_changes.sql). A job change with a webhook endpoint enabled no longer builds the
job's message in its statement (3.6 KB of WAL a job at five versions, bench/webhooks.py).
A delivery's data.version is its change's or a later one (docs/webhooks.md).

Rows marked before this revision keep their copies, which the fan-out uses as they are.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-04
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
    # Frozen: the live sql/job_changes.sql has moved on (0034).
    _load(FROZEN / "job_changes_0031.sql")


def downgrade() -> None:
    # 0030's fan-out copies a marked row's payload into its deliveries: a row marked
    # without one gets its job's message as the job stands now (what this revision's
    # fan-out would have sent).
    op.execute(
        """
        UPDATE creation.outbox AS o SET payload = creation.job_message(j)
        FROM creation.jobs AS j
        WHERE o.webhooks_pending AND o.payload IS NULL AND j.job_id = o.job_id
        """
    )
    _load(FROZEN / "job_changes_0030.sql")
