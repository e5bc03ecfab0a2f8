"""a job change's side rows (its event, its ledger entry, its outbox row) are written
without a foreign-key check each, a statement that moves no version writes nothing, and an
empty ledger insert adds nothing to the totals.

pg_stat_statements (track = all, bench/end_to_end.py --jobs 800) counted 10.4 foreign-key
checks a job (``SELECT 1 FROM ONLY creation.jobs x WHERE job_id = $1 FOR KEY SHARE OF x``,
one for each creation.job_events, creation.outbox and creation.points_ledger row that
names a job; each an SPI query, planned once a backend, that locks the job row it reads).
What those three foreign keys guaranteed, that the job a row names exists, is given
instead by:

* the only writers of those rows are the statement triggers of sql/job_changes.sql
  (write_job_inserts, write_job_updates: tests/unit/test_one_job_writer.py holds every
  other file of services/ to that), and they write them from the transition tables of the
  very statement that inserted or updated the job's row, in its transaction: the row they
  name is there, written by that statement, when they are inserted and when they commit;
* a job's row is never deleted: a deleted job is its tombstone (deleted_at,
  store/deletions.py; no DELETE of creation.jobs in services/). The foreign keys enforced
  that for every job with a side row, which is every job (its reservation and its
  submit's event are never deleted; the ledger is append-only): ``jobs_never_deleted``
  enforces it now for every row, a trigger that only runs on a DELETE, so on no job's path.

The relay and the webhook fan-out read the job of each outbox row they take (an inner join
by pk_jobs): they rely on that row existing, as before.

Also:

* write_job_updates returns at once when the statement moved no version (a heartbeat, a
  fenced write whose fence no longer held). Before, it still ran its one statement of three
  inserts over no row, each of which fired its table's statement triggers: the ledger
  totals' upsert, and the outbox's NOTIFY, which woke every relay for a round that found
  nothing.
* add_to_ledger_totals returns at once when the insert that fired it added no entry (a
  submit's welcome, written once per user, runs as a CTE of every submit; an update with
  no ledger effect runs its ledger insert over no row): 2.98 firings a job, 1.7 of them
  empty.

* creation.fan_out_webhooks is PL/pgSQL with a generic plan kept per session
  (sql/job_changes.sql): as a SQL function its statement, which inlines the job's message,
  was planned at every call (pg_stat_statements: 135 plans in 155 calls, 1.45 ms of
  planning a job summed, on PostgreSQL 18 as on 15), every deliverer's poll and wake-up.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

# The foreign keys dropped: (table, constraint).
SIDE_ROW_KEYS = (
    ("job_events", "fk_job_events_job_id_jobs"),
    ("outbox", "fk_outbox_job_id_jobs"),
    ("points_ledger", "fk_points_ledger_job_id_jobs"),
)

REFUSE_JOB_DELETION = """
CREATE FUNCTION creation.refuse_job_deletion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'creation.jobs rows are never deleted: job % refused', OLD.job_id
        USING ERRCODE = 'restrict_violation',
              HINT = 'a deleted job is a tombstone (deleted_at); its events, ledger '
                     'entries and outbox rows name it (migration 0034)';
END
$$
"""

TOTALS_FUNCTION = """
CREATE OR REPLACE FUNCTION creation.add_to_ledger_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- An insert that added no entry adds nothing (migration 0034).
    IF NOT EXISTS (SELECT FROM added) THEN
        RETURN NULL;
    END IF;
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

# 0013's, as it was.
TOTALS_FUNCTION_0013 = """
CREATE OR REPLACE FUNCTION creation.add_to_ledger_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
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
    op.execute(REFUSE_JOB_DELETION)
    op.execute(
        "CREATE TRIGGER jobs_never_deleted BEFORE DELETE ON creation.jobs"
        " FOR EACH ROW EXECUTE FUNCTION creation.refuse_job_deletion()"
    )
    for table, constraint in SIDE_ROW_KEYS:
        op.drop_constraint(constraint, table, type_="foreignkey", schema=SCHEMA)
    op.execute(TOTALS_FUNCTION)
    _load(CREATION / "sql" / "job_changes.sql")


def downgrade() -> None:
    _load(FROZEN / "job_changes_0031.sql")
    op.execute(TOTALS_FUNCTION_0013)
    # Every side row names a job that exists (nothing deleted one meanwhile): validated
    # as they are added.
    for table, constraint in SIDE_ROW_KEYS:
        op.create_foreign_key(
            constraint,
            table,
            "jobs",
            ["job_id"],
            ["job_id"],
            source_schema=SCHEMA,
            referent_schema=SCHEMA,
        )
    op.execute("DROP TRIGGER jobs_never_deleted ON creation.jobs")
    op.execute("DROP FUNCTION creation.refuse_job_deletion()")
