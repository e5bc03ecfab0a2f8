"""one writer of job changes: statement triggers on creation.jobs write each change's
event, ledger entry and outbox row (services/creation/sql/job_changes.sql); the row names
its change (change_*) and who asked to cancel (cancel_requester_*), and so do the events

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

# Each writer names its change on the row (who, why), and the triggers copy it to the
# event; who asked to cancel stays on the row until the job is cancelled or retried.
# Nullable, no default: adding them rewrites nothing.
JOB_COLUMNS = (
    "change_actor_kind",
    "change_actor_id",
    "change_reason",
    "cancel_requester_kind",
    "cancel_requester_id",
)
EVENT_COLUMNS = ("requester_kind", "requester_id")

# A cancel request changes no status but is an event: it names who asked.
IS_A_CHANGE = "from_status IS NULL OR from_status <> to_status OR requester_kind IS NOT NULL"
WAS_A_CHANGE = "from_status IS NULL OR from_status <> to_status"

# The submit function's last signature without the payload (the triggers build it now).
OLD_SUBMIT = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, jsonb, timestamptz,"
    " integer, text)"
)
NEW_SUBMIT = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, timestamptz, integer, text)"
)
FUNCTIONS = (
    "creation.write_job_updates()",
    "creation.write_job_inserts()",
    "creation.ledger_effect(text)",
    "creation.job_state(creation.jobs)",
    "creation.rfc3339(timestamptz)",
)


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    (migrations/frozen)."""
    return (FROZEN / f"submit_job_{revision}.sql").read_text()


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (a prepared statement holds one command): a
    statement ends at a line ending in ``;`` outside a ``$$``-quoted body; comment lines
    never end one."""
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
    for name in JOB_COLUMNS:
        op.add_column("jobs", sa.Column(name, sa.Text()), schema=SCHEMA)
    for name in EVENT_COLUMNS:
        op.add_column("job_events", sa.Column(name, sa.Text()), schema=SCHEMA)
    op.drop_constraint(op.f("ck_job_events_is_a_change"), "job_events", schema=SCHEMA)
    op.create_check_constraint(
        op.f("ck_job_events_is_a_change"), "job_events", sa.text(IS_A_CHANGE), schema=SCHEMA
    )
    # Frozen: the live sql/job_changes.sql has moved on (0019).
    for statement in statements((FROZEN / "job_changes_0018.sql").read_text()):
        op.execute(statement)
    op.execute(f"DROP FUNCTION {OLD_SUBMIT}")
    # Frozen: the live sql/submit_job.sql has moved on (0025).
    op.execute(frozen_submit_function("0018"))


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {NEW_SUBMIT}")
    op.execute((FROZEN / "submit_job_0017.sql").read_text())
    op.execute("DROP TRIGGER jobs_changes_updated ON creation.jobs")
    op.execute("DROP TRIGGER jobs_changes_inserted ON creation.jobs")
    for function in FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    # Cancel requests' events have no place in the older table.
    op.execute(
        "DELETE FROM creation.job_events WHERE requester_kind IS NOT NULL AND from_status = to_status"
    )
    op.drop_constraint(op.f("ck_job_events_is_a_change"), "job_events", schema=SCHEMA)
    op.create_check_constraint(
        op.f("ck_job_events_is_a_change"), "job_events", sa.text(WAS_A_CHANGE), schema=SCHEMA
    )
    for name in EVENT_COLUMNS:
        op.drop_column("job_events", name, schema=SCHEMA)
    for name in JOB_COLUMNS:
        op.drop_column("jobs", name, schema=SCHEMA)
