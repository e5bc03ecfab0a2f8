"""ledger entries in the order they were made: a first submit inserts its welcome grant
before the reserve it pays for, and ListLedgerEntries pages by entry_id
(ix_points_ledger_user_sequence replaces ix_points_ledger_user_newest)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"


def _revision_0013() -> ModuleType:
    """0013's migration module: its submit_function() is the function this one changes,
    and the one the downgrade puts back."""
    path = Path(__file__).with_name("0013_ledger_totals.py")
    spec = importlib.util.spec_from_file_location("creation_revision_0013", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The data-modifying CTEs of one statement run in an order PostgreSQL does not promise
# (in practice the ones nothing reads run last, in reverse), so the reserve took its
# entry_id before the welcome grant that paid for it, at the same p_now. The reservation
# now reads the welcome's RETURNING (an aggregate: it waits for the whole insert), so the
# grant's entry_id is always the smaller. Each (before, after) pair must match 0013's text
# exactly once (history is frozen).
CHANGES = (
    (
        """            ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
          ),
          job AS (""",
        """            ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
            RETURNING entry_id
          ),
          job AS (""",
    ),
    (
        """            SELECT p_user_id, job_id, 'reserve', price_points, 'submitted', p_now FROM job
          ),""",
        """            -- After the welcome (migration 0015): the entries' sequence is their order.
            SELECT p_user_id, job_id, 'reserve', price_points, 'submitted', p_now
            FROM job CROSS JOIN (SELECT count(*) FROM welcome) AS welcomed_first
          ),""",
    ),
)


def submit_function() -> str:
    """This revision's creation.submit_job: 0013's with CHANGES made."""
    statement: str = _revision_0013().submit_function()
    for before, after in CHANGES:
        if statement.count(before) != 1:
            raise RuntimeError(f"0013's submit_job no longer reads {before!r} once")
        statement = statement.replace(before, after)
    return statement


def upgrade() -> None:
    op.execute(submit_function())
    op.create_index(
        "ix_points_ledger_user_sequence",
        "points_ledger",
        ["user_id", sa.literal_column("entry_id DESC")],
        unique=False,
        schema=SCHEMA,
    )
    op.drop_index("ix_points_ledger_user_newest", table_name="points_ledger", schema=SCHEMA)


def downgrade() -> None:
    op.create_index(
        "ix_points_ledger_user_newest",
        "points_ledger",
        ["user_id", sa.literal_column("created_at DESC"), sa.literal_column("entry_id DESC")],
        unique=False,
        schema=SCHEMA,
    )
    op.drop_index("ix_points_ledger_user_sequence", table_name="points_ledger", schema=SCHEMA)
    op.execute(_revision_0013().submit_function())
