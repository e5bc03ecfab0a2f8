"""typed job failures: beside its internal error code a job stores what its owner is told,
error_reason (a JobErrorReason's name without its prefix) and error_retryable (would
submitting again help?); existing errors are backfilled, a CHECK holds them to the code
(so a failed or attention job, which has a code, has a reason), and the outbox payload's error carries the reason and
flag instead of the code (sql/job_changes.sql)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

# services/creation/job_errors.py as this revision found it (a migration imports nothing of
# ours): internal code -> (reason, whether submitting again may help). A code of no row
# is a provider's own: PROVIDER_ERROR, not retryable (what its adapter declared is lost).
REASONS = {
    "TIMEOUT": ("PROVIDER_TIMEOUT", True),
    "UNAVAILABLE": ("PROVIDER_UNAVAILABLE", True),
    "RATE_LIMITED": ("PROVIDER_RATE_LIMITED", True),
    "AUTH_REJECTED": ("PROVIDER_AUTH_REJECTED", False),
    "TRANSIENT": ("PROVIDER_TRANSIENT_FAILURE", True),
    "REQUEST_UNKNOWN": ("PROVIDER_REQUEST_LOST", True),
    "CONTENT_REJECTED": ("PROVIDER_REJECTED_CONTENT", False),
    "INPUT_UNREADABLE": ("PROVIDER_REJECTED_INPUT", False),
    "INVALID_INPUT": ("PROVIDER_INVALID_REQUEST", False),
    "CANCELLED": ("PROVIDER_CANCELLED", True),
    "INTERNAL": ("PROVIDER_INTERNAL", True),
    "OUTPUT_EXPIRED": ("PROVIDER_OUTPUT_EXPIRED", True),
    "OUTPUT_INVALID": ("PROVIDER_OUTPUT_INVALID", False),
    "PROVIDER_BUG": ("PROVIDER_ERROR", True),
    "PROVIDER_NOT_CONFIGURED": ("MODEL_NOT_CONFIGURED", False),
    "MEDIA_UNAVAILABLE": ("INPUT_UNAVAILABLE", True),
    "OUTPUT_REJECTED": ("OUTPUT_REJECTED", True),
    "NO_OUTPUT": ("OUTPUT_MISSING", True),
    "LEASE_EXPIRED": ("WORKER_LOST", True),
    "OUTCOME_UNKNOWN": ("OUTCOME_UNKNOWN", False),
    "OPERATOR_FAILED": ("OPERATOR_FAILED", False),
}
# A reason and flag exactly when there is a code: with failed_shape and attention_shape
# (which require a code), a failed or attention job always has a reason.
ERROR_ANSWERED = (
    "(error_reason IS NULL) = (error_code IS NULL)"
    " AND (error_retryable IS NULL) = (error_code IS NULL)"
)


def _backfill() -> str:
    reasons = " ".join(f"WHEN '{code}' THEN '{r}'" for code, (r, _) in REASONS.items())
    retryable = [code for code, (_, again) in REASONS.items() if again]
    listed = ", ".join(f"'{code}'" for code in retryable)
    # Changes no version: the triggers write no event or outbox row for it.
    return (
        f"UPDATE {SCHEMA}.jobs SET"  # noqa: S608
        f" error_reason = CASE error_code {reasons} ELSE 'PROVIDER_ERROR' END,"
        f" error_retryable = error_code IN ({listed})"
        " WHERE error_code IS NOT NULL"
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
    # Nullable, no default: adding them rewrites nothing.
    op.add_column("jobs", sa.Column("error_reason", sa.Text()), schema=SCHEMA)
    op.add_column("jobs", sa.Column("error_retryable", sa.Boolean()), schema=SCHEMA)
    op.execute(_backfill())
    op.create_check_constraint(
        op.f("ck_jobs_error_answered"), "jobs", sa.text(ERROR_ANSWERED), schema=SCHEMA
    )
    # Frozen: the live sql/job_changes.sql has moved on (0023).
    _load(FROZEN / "job_changes_0022.sql")


def downgrade() -> None:
    _load(FROZEN / "job_changes_0020.sql")
    op.drop_constraint(op.f("ck_jobs_error_answered"), "jobs", schema=SCHEMA)
    op.drop_column("jobs", "error_retryable", schema=SCHEMA)
    op.drop_column("jobs", "error_reason", schema=SCHEMA)
