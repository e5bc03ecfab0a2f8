"""ledger entries in the order they were made: a first submit inserts its welcome grant
before the reserve it pays for, and ListLedgerEntries pages by entry_id
(ix_points_ledger_user_sequence replaces ix_points_ledger_user_newest)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"


# This revision's function (frozen/submit_job_0015.sql) is 0013's with one change. The
# data-modifying CTEs of one statement run in an order PostgreSQL does not promise (in
# practice the ones nothing reads run last, in reverse), so the reserve took its entry_id
# before the welcome grant that paid for it, at the same p_now. The reservation now reads
# the welcome's RETURNING (an aggregate: it waits for the whole insert), so the grant's
# entry_id is always the smaller.


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    op.execute(frozen_submit_function("0015"))
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
    op.execute(frozen_submit_function("0013"))
