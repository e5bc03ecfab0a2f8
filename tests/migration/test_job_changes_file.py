"""The job change triggers run as services/creation/sql/job_changes.sql reads, its
payload builder is inlined, downgrading 0019 brings back 0018's (frozen) JobState
builder, and downgrading 0018 takes the triggers away with the columns they read,
bringing back 0017's submit."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import asyncpg
import pytest
from sqlalchemy import Connection, text

from atelier.creation.v1 import job_pb2
from services.creation.relay.jobs import read_job
from services.kit import migrations
from tests.migration.test_migrations import RUNNING_JOB, run
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
    return functions_of(JOB_CHANGES.read_text())


def functions_of(script: str) -> dict[str, str]:
    found = re.findall(r"CREATE OR REPLACE FUNCTION creation\.(\w+)\(.*?\$\$;", script, re.S)
    statements = re.findall(r"CREATE OR REPLACE FUNCTION .*?\$\$;", script, re.S)
    return {name: body(statement) for name, statement in zip(found, statements, strict=True)}


def test_the_database_runs_the_job_changes_file(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    assert len(functions()) == 7
    assert "job_message" in functions()
    for name, source in functions().items():
        assert fetch(scratch_database, FUNCTION_SOURCE, name) == source, name
    assert fetch(scratch_database, TRIGGERS) == 2
    assert fetch(scratch_database, SUBMIT, "u-head") == "ok"
    assert fetch(scratch_database, EVENTS, "u-head") == 1


FROZEN = CREATION / "migrations" / "frozen"
PAYLOAD_PLAN = """
    EXPLAIN (VERBOSE, COSTS OFF) SELECT creation.job_message(j) FROM creation.jobs AS j
"""
PAYLOAD = "SELECT payload FROM creation.outbox ORDER BY outbox_id DESC LIMIT 1"
# What the relay delivers for a row, from 0019 on: its payload, or (from 0030, which keeps
# one only on a row marked for the webhooks) the job's message built from its row.
DELIVERED = "coalesce(o.payload, creation.job_message(j))"
MESSAGE = (
    f"SELECT {DELIVERED} FROM creation.outbox AS o JOIN creation.jobs AS j USING (job_id)"
    " ORDER BY o.outbox_id DESC LIMIT 1"
)


def explain(url: str, query: str) -> str:
    async def go() -> str:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return "\n".join(row[0] for row in await connection.fetch(query))
        finally:
            await connection.close()

    return asyncio.run(go())


def test_the_payload_builder_is_inlined(scratch_database: str) -> None:
    """A single-expression SQL function: the planner puts its body in the query (a call
    per row would cost ~40% of the database's CPU per job)."""
    migrations.upgrade("creation", scratch_database)
    plan = explain(scratch_database, PAYLOAD_PLAN)
    assert "jsonb_build_object" in plan and "job_message" not in plan, plan


def test_downgrading_0019_brings_back_0018s_job_state_payload(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.downgrade("creation", scratch_database, "0018")
    frozen = functions_of((FROZEN / "job_changes_0018.sql").read_text())
    assert fetch(scratch_database, FUNCTION_SOURCE, "job_state") == frozen["job_state"]
    assert fetch(scratch_database, FUNCTION_SOURCE, "job_message") is None
    assert fetch(scratch_database, SUBMIT, "u-0018") == "ok"
    assert "modelId" not in json.loads(str(fetch(scratch_database, PAYLOAD)))
    migrations.upgrade("creation", scratch_database)
    assert fetch(scratch_database, SUBMIT, "u-0019") == "ok"
    assert json.loads(str(fetch(scratch_database, MESSAGE)))["modelId"]


def test_0020_writes_the_price_as_a_number_and_its_downgrade_as_0019_did(
    scratch_database: str,
) -> None:
    """int32 in the API: a JSON number from 0020 on, int64's string before."""
    migrations.upgrade("creation", scratch_database)
    assert fetch(scratch_database, SUBMIT, "u-0020") == "ok"
    assert type(json.loads(str(fetch(scratch_database, MESSAGE)))["pricePoints"]) is int
    migrations.downgrade("creation", scratch_database, "0019")
    frozen = functions_of((FROZEN / "job_changes_0019.sql").read_text())
    assert fetch(scratch_database, FUNCTION_SOURCE, "job_message") == frozen["job_message"]
    assert fetch(scratch_database, SUBMIT, "u-0019") == "ok"
    assert type(json.loads(str(fetch(scratch_database, MESSAGE)))["pricePoints"]) is str


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


def _failed_jobs(url: str) -> dict[str, str]:
    """At 0021: one running job left alone and one ended with each code, by code."""
    released = "lease_owner = NULL, lease_expires_at = NULL"
    ends = {
        "INPUT_UNREADABLE": f"status = 'failed', completed_at = now(), {released}",
        "BACKEND_SPECIFIC": f"status = 'failed', completed_at = now(), {released}",
        "LEASE_EXPIRED": f"status = 'failed', completed_at = now(), {released}",
        "OUTCOME_UNKNOWN": f"status = 'needs_attention', {released}",
        "": "progress = 60",
    }

    def play(connection: Connection) -> dict[str, str]:
        made = {}
        for code, change in ends.items():
            job_id = str(uuid.uuid4())
            connection.execute(text(RUNNING_JOB), {"job_id": job_id})
            error = f", error_code = '{code}', error_message = 'm'" if code else ""
            connection.execute(
                text(f"UPDATE creation.jobs SET {change}{error} WHERE job_id = :j"),
                {"j": job_id},
            )
            made[code] = job_id
        connection.commit()
        return made

    found = run(url, play)
    assert isinstance(found, dict)
    return found


def _next_payload_error(url: str, job_id: str) -> object:
    """The error of the job's message the relay delivers for a new version."""
    bump = "UPDATE creation.jobs SET version = version + 1 WHERE job_id = $1"
    fetch(url, f"WITH bumped AS ({bump} RETURNING 1) SELECT count(*) FROM bumped", job_id)
    last = (
        f"SELECT {DELIVERED} -> 'error' FROM creation.outbox AS o"
        " JOIN creation.jobs AS j USING (job_id) WHERE job_id = $1"
        " ORDER BY o.version DESC LIMIT 1"
    )
    text_ = fetch(url, last, job_id)
    return None if text_ is None else json.loads(text_)


def test_0022_backfills_each_error_and_its_downgrade_brings_back_0020s_payload(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database, "0021")
    jobs = _failed_jobs(scratch_database)
    migrations.upgrade("creation", scratch_database)

    stored = "SELECT error_reason || ' ' || error_retryable FROM creation.jobs WHERE job_id = $1"
    assert {code: fetch(scratch_database, stored, job) for code, job in jobs.items()} == {
        "INPUT_UNREADABLE": "PROVIDER_REJECTED_INPUT false",
        "BACKEND_SPECIFIC": "PROVIDER_ERROR false",
        "LEASE_EXPIRED": "WORKER_LOST true",
        "OUTCOME_UNKNOWN": "OUTCOME_UNKNOWN false",
        "": None,
    }
    # The payload's error is the typed one (a false flag is a default: left out).
    assert _next_payload_error(scratch_database, jobs["INPUT_UNREADABLE"]) == {
        "reason": "JOB_ERROR_REASON_PROVIDER_REJECTED_INPUT",
        "message": "m",
    }
    assert _next_payload_error(scratch_database, jobs["LEASE_EXPIRED"]) == {
        "reason": "JOB_ERROR_REASON_WORKER_LOST",
        "retryable": True,
        "message": "m",
    }
    assert _next_payload_error(scratch_database, jobs[""]) is None
    # A failed job whose reason is missing is refused.
    with pytest.raises(asyncpg.CheckViolationError, match="ck_jobs_error_answered"):
        fetch(
            scratch_database,
            "UPDATE creation.jobs SET error_reason = NULL WHERE job_id = $1",
            jobs["OUTCOME_UNKNOWN"],
        )

    migrations.downgrade("creation", scratch_database, "0021")
    frozen = functions_of((FROZEN / "job_changes_0020.sql").read_text())
    assert fetch(scratch_database, FUNCTION_SOURCE, "job_message") == frozen["job_message"]
    assert _next_payload_error(scratch_database, jobs["INPUT_UNREADABLE"]) == {
        "code": "INPUT_UNREADABLE",
        "message": "m",
    }
    migrations.upgrade("creation", scratch_database)
    for name, source in functions().items():
        assert fetch(scratch_database, FUNCTION_SOURCE, name) == source, name


def test_each_frozen_job_changes_text_is_its_revisions_own() -> None:
    """A frozen job_changes_<rev>.sql is loaded by revision <rev> (and a later one's
    downgrade); the live file by one revision, newer than every frozen text."""
    versions = CREATION / "migrations" / "versions"
    sources = {path.name[:4]: path.read_text() for path in versions.glob("[0-9]*.py")}
    frozen = sorted(
        path.stem.removeprefix("job_changes_")
        for path in (CREATION / "migrations" / "frozen").glob("job_changes_*.sql")
    )
    assert frozen
    for revision in frozen:
        assert f'"job_changes_{revision}.sql"' in sources[revision]
        # ...and by the downgrade of the next revision that loads the file.
        assert any(f'"job_changes_{revision}.sql"' in sources[r] for r in sources if r > revision)
    (loader,) = [r for r, source in sources.items() if '"sql" / "job_changes.sql"' in source]
    assert loader > frozen[-1]


OLD_PARAMETERS = {
    "seed": 2**63 - 1,
    "steps": 30,
    "guidance_scale": 7,  # a float parameter written whole
    "strength": 0.5,
    "hdr": True,
    "sampler": "ddim",
    "extra": [1, 2],  # from the free-form era: kept as its JSON text
}
SUBMIT_WITH_PARAMETERS = SUBMIT.replace("p_parameters => '{}'", "p_parameters => $2::jsonb")
JOB_OF = "SELECT job_id::text FROM creation.jobs WHERE user_id = $1"
PARAMETERS_OF = "SELECT parameters::text FROM creation.jobs WHERE job_id = $1::uuid"
LAST_PAYLOAD_OF = (
    f"SELECT {DELIVERED}::text FROM creation.outbox AS o JOIN creation.jobs AS j"
    " USING (job_id) WHERE job_id = $1::uuid ORDER BY o.version DESC LIMIT 1"
)


def test_0023_stores_parameters_as_the_contracts_values_and_its_downgrade_gives_them_back(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database, "0022")
    assert (
        fetch(scratch_database, SUBMIT_WITH_PARAMETERS, "u-0022", json.dumps(OLD_PARAMETERS))
        == "ok"
    )
    job_id = fetch(scratch_database, JOB_OF, "u-0022")
    before = json.loads(fetch(scratch_database, LAST_PAYLOAD_OF, job_id))
    assert before["generationParameters"]["seed"] == str(2**63 - 1)

    migrations.upgrade("creation", scratch_database)
    tagged = {
        "seed": {"intValue": str(2**63 - 1)},
        "steps": {"intValue": "30"},
        "guidance_scale": {"floatValue": 7},
        "strength": {"floatValue": 0.5},
        "hdr": {"boolValue": True},
        "sampler": {"stringValue": "ddim"},
        "extra": {"stringValue": "[1, 2]"},
    }
    assert json.loads(fetch(scratch_database, PARAMETERS_OF, job_id)) == tagged
    # The undelivered payload was rewritten: the relay reads the map from it.
    pending = json.loads(fetch(scratch_database, LAST_PAYLOAD_OF, job_id))
    assert "generationParameters" not in pending
    assert pending["parameters"] == {
        name: tagged[name] for name in ("seed", "steps", "guidance_scale", "strength")
    }
    message = job_pb2.Job()
    read_job(pending, message)
    assert message.parameters["seed"].int_value == 2**63 - 1
    assert message.parameters["guidance_scale"].WhichOneof("kind") == "float_value"
    # A new version's payload copies the stored map.
    bump = "UPDATE creation.jobs SET version = version + 1 WHERE job_id = $1::uuid"
    fetch(scratch_database, f"WITH b AS ({bump} RETURNING 1) SELECT count(*) FROM b", job_id)
    assert json.loads(fetch(scratch_database, LAST_PAYLOAD_OF, job_id))["parameters"] == tagged
    # A job with no parameters has none in its payload (as protobuf leaves an empty map).
    assert fetch(scratch_database, SUBMIT, "u-0023") == "ok"
    empty = fetch(scratch_database, JOB_OF, "u-0023")
    assert "parameters" not in json.loads(fetch(scratch_database, LAST_PAYLOAD_OF, empty))

    migrations.downgrade("creation", scratch_database, "0022")
    frozen = functions_of((FROZEN / "job_changes_0022.sql").read_text())
    assert fetch(scratch_database, FUNCTION_SOURCE, "job_message") == frozen["job_message"]
    assert json.loads(fetch(scratch_database, PARAMETERS_OF, job_id)) == {
        **OLD_PARAMETERS,
        "extra": "[1, 2]",
    }
    migrations.upgrade("creation", scratch_database)
