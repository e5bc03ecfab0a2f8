"""ledger_totals: each user's points ledger summed by kind, kept by a trigger on
points_ledger, so SubmitJob and GetBalance read one row instead of summing the user's
whole history; the index those sums rode (ix_points_ledger_user) goes

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

# Why a trigger: every writer of the ledger (the submit function, the worker's batched
# fenced statements, changes.record, grants, GetBalance's welcome) keeps the totals right
# without knowing about them, in the same transaction as its entries. Statement-level
# with a transition table: a batch of N entries is one aggregate and one upsert per user,
# not N row triggers. Ledger rows are append-only (nothing updates or deletes them; a
# second trigger refuses it), so an insert is the only change the totals follow; a
# TRUNCATE (tests empty the tables between cases) empties them too.
#
# No deadlock from the totals' row locks. A transaction locks the totals rows of the users
# it adds entries for in the trigger, at the end of the statement that added them:
# - each trigger call upserts its users in user_id order, byte order (COLLATE "C", which is
#   Python's str order, so a caller that sorts in Python agrees); ModifyTable inserts the
#   rows its sorted input yields one by one, so it takes the row locks in that order;
# - a transaction that adds entries in more than one statement adds them in user order
#   across statements too (leases.reap_decided writes its jobs sorted by user; every other
#   multi-statement writer touches one user);
# - after taking a totals lock a transaction waits for nothing but further totals locks:
#   every other lock it takes (the user's advisory lock in submit_job and
#   user_transaction, the job rows FOR UPDATE of the fenced writes, the reaper and
#   changes.record's callers, the unique-key waits of ledger inserts) is taken before the
#   statement that adds its entries ends. grant_points therefore adds its grant and the
#   welcome in one statement: had it taken the totals lock with the grant and then waited
#   on GetBalance's uncommitted welcome row, that GetBalance would wait for the same lock.
#   (A remote worker's keyed call may wait, in its last statement, on a twin call's
#   uncommitted remote_calls key; that twin has already made its last wait: no cycle.)
# So every wait for a totals lock is for a higher user_id than any its waiter holds, and
# no cycle can close. The submit's advisory lock comes first and is only ever taken by
# transactions holding no totals lock.
TOTALS_FUNCTION = """
CREATE FUNCTION creation.add_to_ledger_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO creation.ledger_totals AS t
        (user_id, granted, reserved, captured, released, welcomed)
    SELECT user_id,
           coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0),
           coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0),
           coalesce(sum(amount) FILTER (WHERE kind = 'capture'), 0),
           coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0),
           coalesce(bool_or(grant_key = 'welcome'), false)
    FROM added
    GROUP BY user_id
    -- The lock order (see migration 0013).
    ORDER BY user_id COLLATE "C"
    ON CONFLICT (user_id) DO UPDATE
    SET granted = t.granted + excluded.granted,
        reserved = t.reserved + excluded.reserved,
        captured = t.captured + excluded.captured,
        released = t.released + excluded.released,
        welcomed = t.welcomed OR excluded.welcomed;
    RETURN NULL;
END
$$
"""

REFUSE_FUNCTION = """
CREATE FUNCTION creation.refuse_ledger_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'creation.points_ledger is append-only: % refused', TG_OP
        USING HINT = 'creation.ledger_totals sums its inserts; add an entry instead';
END
$$
"""

EMPTY_FUNCTION = """
CREATE FUNCTION creation.empty_ledger_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- DELETE, not TRUNCATE: it takes no lock a reader of the totals would wait on.
    DELETE FROM creation.ledger_totals;
    RETURN NULL;
END
$$
"""

# Every user's totals as the ledger holds them now (the same sums the readers made).
BACKFILL = """
INSERT INTO creation.ledger_totals (user_id, granted, reserved, captured, released, welcomed)
SELECT user_id,
       coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0),
       coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0),
       coalesce(sum(amount) FILTER (WHERE kind = 'capture'), 0),
       coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0),
       coalesce(bool_or(grant_key = 'welcome'), false)
FROM creation.points_ledger
GROUP BY user_id
"""


# This revision's function (frozen/submit_job_0013.sql) is 0008's with its balance read
# from the user's totals row instead of a sum over the user's ledger. No row yet is zeros
# and not welcomed (the aggregates over no row).


def frozen_submit_function(revision: str) -> str:
    """The CREATE FUNCTION statement of creation.submit_job as ``revision`` made it, frozen
    in migrations/frozen (a later change of the rules never changes it)."""
    return (Path(__file__).parents[1] / "frozen" / f"submit_job_{revision}.sql").read_text()


def upgrade() -> None:
    op.create_table(
        "ledger_totals",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("granted", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("reserved", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("captured", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("released", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("welcomed", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_ledger_totals")),
        schema=SCHEMA,
    )
    # Writers wait from here to the migration's commit: no entry lands between the
    # backfill's sums and the trigger, and every entry committed before is summed.
    op.execute("LOCK TABLE creation.points_ledger IN SHARE ROW EXCLUSIVE MODE")
    op.execute(TOTALS_FUNCTION)
    op.execute(
        "CREATE TRIGGER points_ledger_totals AFTER INSERT ON creation.points_ledger"
        " REFERENCING NEW TABLE AS added"
        " FOR EACH STATEMENT EXECUTE FUNCTION creation.add_to_ledger_totals()"
    )
    op.execute(REFUSE_FUNCTION)
    op.execute(
        "CREATE TRIGGER points_ledger_append_only BEFORE UPDATE OR DELETE"
        " ON creation.points_ledger"
        " FOR EACH STATEMENT EXECUTE FUNCTION creation.refuse_ledger_change()"
    )
    op.execute(EMPTY_FUNCTION)
    op.execute(
        "CREATE TRIGGER points_ledger_truncated AFTER TRUNCATE ON creation.points_ledger"
        " FOR EACH STATEMENT EXECUTE FUNCTION creation.empty_ledger_totals()"
    )
    op.execute(BACKFILL)
    op.execute(frozen_submit_function("0013"))
    # Only the sums rode it; every ledger insert paid for it.
    op.drop_index("ix_points_ledger_user", table_name="points_ledger", schema=SCHEMA)


def downgrade() -> None:
    # The index the sums ride, then 0008's function: it sums the ledger again before the
    # totals go.
    op.create_index(
        "ix_points_ledger_user", "points_ledger", ["user_id", "kind"], unique=False, schema=SCHEMA
    )
    op.execute(frozen_submit_function("0008"))
    op.execute("DROP TRIGGER points_ledger_truncated ON creation.points_ledger")
    op.execute("DROP FUNCTION creation.empty_ledger_totals()")
    op.execute("DROP TRIGGER points_ledger_append_only ON creation.points_ledger")
    op.execute("DROP FUNCTION creation.refuse_ledger_change()")
    op.execute("DROP TRIGGER points_ledger_totals ON creation.points_ledger")
    op.execute("DROP FUNCTION creation.add_to_ledger_totals()")
    op.drop_table("ledger_totals", schema=SCHEMA)
