"""creation.submit_job runs as services/creation/sql/submit_job.sql reads, from whichever
revision a database is upgraded; each revision keeps its own frozen text, and no revision
loads another."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from alembic.script import ScriptDirectory

from services.kit import migrations

CREATION = Path(__file__).resolve().parents[2] / "services" / "creation"
SUBMIT_RULES = CREATION / "sql" / "submit_job.sql"
FROZEN = CREATION / "migrations" / "frozen"
VERSIONS = CREATION / "migrations" / "versions"

SUBMIT_SOURCE = "SELECT prosrc FROM pg_proc WHERE oid = 'creation.submit_job'::regproc"
TRANSITION_TRIGGER = """
    SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_transition_legal'
      AND tgrelid = 'creation.jobs'::regclass
"""
SUBMIT = """
    SELECT submit_outcome FROM creation.submit_job(
      p_job_id => gen_random_uuid(), p_user_id => $1, p_idempotency_key => NULL,
      p_model_id => 'stub-fast', p_style_id => 'watercolor',
      p_input_asset_id => gen_random_uuid(), p_prompt => '', p_negative_prompt => '',
      p_width => 512, p_height => 512, p_parameters => '{}', p_max_attempts => 3,
      p_request_hash => repeat('0', 64), p_day_start => now() - interval '1 day',
      p_daily_quota => 100, p_in_flight_limit => 100, p_welcome_points => 100,
      p_now => now(), p_num_outputs => 1, p_trace_parent => NULL)
"""

# The submit as revisions before 0018 took it: with the first outbox row's payload (the
# job's insert trigger builds it since).
SUBMIT_WITH_PAYLOAD = SUBMIT.replace("p_now => now()", "p_payload => '{}', p_now => now()")


def body(statement: str) -> str:
    """What PostgreSQL keeps of a CREATE FUNCTION (prosrc): the text between its $$."""
    start, end = statement.index("$$") + 2, statement.rindex("$$")
    return statement[start:end]


def fetch(url: str, query: str, *args: Any) -> Any:
    async def go() -> Any:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return await connection.fetchval(query, *args)
        finally:
            await connection.close()

    return asyncio.run(go())


def revisions() -> list[str]:
    """creation's revisions, oldest first."""
    script = ScriptDirectory.from_config(migrations.alembic_config("creation", "unused"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def test_the_database_runs_the_submit_rules_file(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    assert fetch(scratch_database, SUBMIT_SOURCE) == body(SUBMIT_RULES.read_text())
    assert fetch(scratch_database, SUBMIT, "u-head") == "ok"


@pytest.mark.parametrize("revision", revisions()[:-1])
def test_upgrading_from_an_old_revision_reaches_the_same_head(
    scratch_database: str, revision: str
) -> None:
    migrations.upgrade("creation", scratch_database, revision)
    migrations.upgrade("creation", scratch_database)
    assert fetch(scratch_database, SUBMIT_SOURCE) == body(SUBMIT_RULES.read_text())
    assert fetch(scratch_database, TRANSITION_TRIGGER) == 1
    assert fetch(scratch_database, SUBMIT, f"u-{revision}") == "ok"


def test_downgrading_0016_brings_back_0015s_function_and_drops_the_trigger(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.downgrade("creation", scratch_database, "0015")
    frozen = (FROZEN / "submit_job_0015.sql").read_text()
    assert fetch(scratch_database, SUBMIT_SOURCE) == body(frozen)
    assert fetch(scratch_database, TRANSITION_TRIGGER) == 0
    assert fetch(scratch_database, SUBMIT_WITH_PAYLOAD, "u-0015") == "ok"


def test_each_frozen_text_is_its_revisions_own() -> None:
    """Every frozen submit_job is loaded by the revision that made it (and by the next
    one's downgrade); the rules file by one revision, newer than every frozen text."""
    sources = {path.name[:4]: path.read_text() for path in VERSIONS.glob("[0-9]*.py")}
    frozen = sorted(
        path.stem.removeprefix("submit_job_") for path in FROZEN.glob("submit_job_*.sql")
    )
    for revision in frozen:
        assert f'frozen_submit_function("{revision}")' in sources[revision]
    (loader,) = [r for r, source in sources.items() if '"sql" / "submit_job.sql"' in source]
    assert loader > frozen[-1]


@pytest.mark.parametrize("path", sorted(VERSIONS.glob("[0-9]*.py")), ids=lambda p: p.name)
def test_no_revision_imports_or_patches_another(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = {
        name.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= {"collections", "pathlib", "typing", "sqlalchemy", "alembic", "uuid", "json"}
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [text for text in named if text.endswith(".py")]
