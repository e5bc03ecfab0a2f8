"""The job change triggers run as services/creation/sql/job_changes.sql reads, and
downgrading 0018 takes them away with the columns they read, bringing back 0017's submit."""

from __future__ import annotations

import re

from services.kit import migrations
from tests.migration.test_submit_function import (
    CREATION,
    SUBMIT,
    SUBMIT_WITH_PAYLOAD,
    body,
    fetch,
)

JOB_CHANGES = CREATION / "sql" / "job_changes.sql"
FUNCTION_SOURCE = """
    SELECT prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'creation' AND p.proname = $1
"""
TRIGGERS = """
    SELECT count(*) FROM pg_trigger
    WHERE tgrelid = 'creation.jobs'::regclass AND tgname LIKE 'jobs_changes_%'
"""
EVENTS = "SELECT count(*) FROM creation.job_events WHERE actor_id = $1"


def functions() -> dict[str, str]:
    """Each function the file creates, by name, with its body."""
    script = JOB_CHANGES.read_text()
    found = re.findall(r"CREATE OR REPLACE FUNCTION creation\.(\w+)\(.*?\$\$;", script, re.S)
    statements = re.findall(r"CREATE OR REPLACE FUNCTION .*?\$\$;", script, re.S)
    return {name: body(statement) for name, statement in zip(found, statements, strict=True)}


def test_the_database_runs_the_job_changes_file(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    assert len(functions()) == 5
    for name, source in functions().items():
        assert fetch(scratch_database, FUNCTION_SOURCE, name) == source, name
    assert fetch(scratch_database, TRIGGERS) == 2
    assert fetch(scratch_database, SUBMIT, "u-head") == "ok"
    assert fetch(scratch_database, EVENTS, "u-head") == 1


def test_downgrading_0018_takes_the_triggers_away_and_brings_back_0017s_submit(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.downgrade("creation", scratch_database, "0017")
    assert fetch(scratch_database, TRIGGERS) == 0
    frozen = (CREATION / "migrations" / "frozen" / "submit_job_0017.sql").read_text()
    assert fetch(scratch_database, FUNCTION_SOURCE, "submit_job") == body(frozen)
    # 0017's submit writes its own side rows again.
    assert fetch(scratch_database, SUBMIT_WITH_PAYLOAD, "u-0017") == "ok"
    assert fetch(scratch_database, EVENTS, "u-0017") == 1
    migrations.upgrade("creation", scratch_database)
    assert fetch(scratch_database, SUBMIT, "u-again") == "ok"
    assert fetch(scratch_database, EVENTS, "u-again") == 1
