"""webhook fan-out off the job's path: a job change no longer writes its webhook
deliveries itself. Its outbox row names the change's event type and the job's model and,
while some endpoint is enabled, is marked webhooks_pending; the deliverers fan the marked
rows out to one delivery per endpoint that wants it (creation.fan_out_webhooks, in
sql/job_changes.sql), in batches, claimed with SKIP LOCKED. A job change costs the same
rows whatever the number of endpoints (issue 29's CPU target).

Rows already in the outbox are not marked: their deliveries were written by 0027's
triggers when they were.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-03
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
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
    op.add_column("outbox", sa.Column("event_type", sa.Text(), nullable=True), schema=SCHEMA)
    op.add_column("outbox", sa.Column("model_id", sa.Text(), nullable=True), schema=SCHEMA)
    op.add_column(
        "outbox",
        sa.Column(
            "webhooks_pending", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        schema=SCHEMA,
    )
    # The deliverers' queue: marked rows in order (empty while no endpoint is enabled).
    op.create_index(
        "ix_outbox_webhooks_pending",
        "outbox",
        ["outbox_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("webhooks_pending"),
    )
    _load(FROZEN / "job_changes_0029.sql")


def downgrade() -> None:
    # Rows still marked are fanned out first: 0027's triggers would never see them again.
    op.execute("SELECT creation.fan_out_webhooks(2147483647)")
    _load(FROZEN / "job_changes_0027.sql")
    op.execute("DROP FUNCTION creation.fan_out_webhooks(integer)")
    op.execute("DROP FUNCTION creation.wake_webhooks()")
    op.drop_index("ix_outbox_webhooks_pending", table_name="outbox", schema=SCHEMA)
    op.drop_column("outbox", "webhooks_pending", schema=SCHEMA)
    op.drop_column("outbox", "model_id", schema=SCHEMA)
    op.drop_column("outbox", "event_type", schema=SCHEMA)
