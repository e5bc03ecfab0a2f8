"""A job change's side rows (its event, its ledger entry, its outbox row) are written in
one place: the triggers of services/creation/sql/job_changes.sql. No store, servicer or
other SQL file inserts them itself (user-level ledger entries, grants, name no job)."""

from __future__ import annotations

import re
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"
WRITER = SERVICES / "creation" / "sql" / "job_changes.sql"
SIDE_ROWS = re.compile(
    r"INSERT\s+INTO\s+creation\.(job_events|outbox)\b"
    r"|insert\(\s*(job_events|outbox)\s*\)"
    r"|INSERT\s+INTO\s+creation\.points_ledger\s*\([^)]*\bjob_id\b"
    r"|insert\(\s*points_ledger\s*\)",
    re.IGNORECASE,
)


def sources() -> list[Path]:
    """Every file of services/ that runs as it reads now (migrations keep their history)."""
    return [
        path
        for path in sorted(SERVICES.rglob("*"))
        if path.suffix in (".py", ".sql") and "migrations" not in path.parts
    ]


def test_the_side_rows_of_a_job_change_are_inserted_in_one_file_only() -> None:
    writers = {path for path in sources() if SIDE_ROWS.search(path.read_text())}
    assert writers == {WRITER}


def test_the_writer_inserts_each_side_row_for_submits_and_for_updates() -> None:
    tables = re.findall(r"INSERT INTO creation\.(\w+)", WRITER.read_text())
    # A change's own statements write no webhook delivery: the deliverers' fan-out does,
    # from the outbox rows (last in the file, and never a trigger's).
    assert tables == [
        *("job_events", "points_ledger", "outbox"),
        *("job_events", "points_ledger", "outbox"),
        "webhook_deliveries",
    ]
