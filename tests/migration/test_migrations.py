"""Each service's Alembic history builds exactly the schema its tables describe, and can
go down and up again."""

from __future__ import annotations

import asyncio
import importlib
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from services.dev import postgres
from services.kit import migrations
from services.kit.db import asyncpg_url
from tests.support.job_errors import AN_ERROR
from tests.support.ledger_sums import LEDGER_SUMS, LEDGER_TOTALS

SERVICES = ("creation", "media", "notify")
USER_TABLES = """
    SELECT tablename FROM pg_tables WHERE schemaname = :s AND tablename <> 'alembic_version'
"""


def tables_of(service: str) -> tuple[str, MetaData]:
    module = importlib.import_module(f"services.{service}.tables")
    return module.SCHEMA, module.metadata


def run(url: str, work: object) -> object:
    async def go() -> object:
        engine = create_async_engine(asyncpg_url(url), poolclass=pool.NullPool)
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(work)  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def differences(url: str, service: str) -> list[object]:
    schema, metadata = tables_of(service)

    def compare(connection: Connection) -> list[object]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, _p: type_ != "schema" or name == schema,
                "version_table_schema": schema,
            },
        )
        return list(compare_metadata(context, metadata))

    return run(url, compare)  # type: ignore[return-value]


@pytest.mark.parametrize("service", SERVICES)
def test_migrations_build_the_declared_schema(scratch_database: str, service: str) -> None:
    migrations.upgrade(service, scratch_database)
    assert differences(scratch_database, service) == []


@pytest.mark.parametrize("service", SERVICES)
def test_downgrade_then_upgrade_round_trip(scratch_database: str, service: str) -> None:
    migrations.upgrade(service, scratch_database)
    migrations.downgrade(service, scratch_database, "base")
    schema, _ = tables_of(service)

    def user_tables(connection: Connection) -> list[str]:
        rows = connection.execute(
            text(USER_TABLES),
            {"s": schema},
        )
        return [row[0] for row in rows]

    assert run(scratch_database, user_tables) == []
    migrations.upgrade(service, scratch_database)
    assert differences(scratch_database, service) == []


def test_histories_do_not_collide(scratch_database: str) -> None:
    for service in SERVICES:
        migrations.upgrade(service, scratch_database)

    def versions(connection: Connection) -> dict[str, str]:
        return {
            schema: connection.execute(
                text(f'SELECT version_num FROM "{schema}".alembic_version')
            ).scalar_one()
            for schema in SERVICES
        }

    found = run(scratch_database, versions)
    assert isinstance(found, dict)
    assert set(found) == set(SERVICES)


def test_upgrading_twice_changes_nothing(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.upgrade("creation", scratch_database)

    def count(connection: Connection) -> int:
        return int(connection.execute(text("SELECT count(*) FROM creation.models")).scalar_one())

    # The stub's four (0002), the hosted adapters' four, disabled (0009), and the stub's
    # text-to-image model (0021).
    assert run(scratch_database, count) == 9


CONSTRAINTS = """
    SELECT c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
    FROM pg_constraint k
    JOIN pg_class c ON c.oid = k.conrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :s AND c.relname <> 'alembic_version'
"""
INDEXES = """
    SELECT indexname, indexdef FROM pg_indexes
    WHERE schemaname = :s AND tablename <> 'alembic_version'
"""
STORAGE = """
    SELECT c.relname, array_to_string(c.reloptions, ',') FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :s AND c.relkind = 'r' AND c.reloptions IS NOT NULL
"""


def catalog_of(url: str, schema: str) -> set[tuple[str, str]]:
    def read(connection: Connection) -> set[tuple[str, str]]:
        found: set[tuple[str, str]] = set()
        for query in (CONSTRAINTS, INDEXES, STORAGE):
            found |= {(row[0], row[1]) for row in connection.execute(text(query), {"s": schema})}
        return found

    return run(url, read)  # type: ignore[return-value]


@pytest.mark.parametrize("service", SERVICES)
def test_constraint_and_index_names_and_definitions_match_the_tables(
    scratch_database: str, postgres_admin_url: str, service: str
) -> None:
    """Alembic's comparison skips CHECK constraints, index details and storage parameters:
    compare PostgreSQL's own catalog of a migrated database with one built straight from
    the tables."""
    migrations.upgrade(service, scratch_database)
    schema, metadata = tables_of(service)
    name = f"atelier_declared_{uuid.uuid4().hex[:10]}"
    declared = postgres.ensure_database(postgres_admin_url, name)
    try:

        def create(connection: Connection) -> None:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
            metadata.create_all(connection)
            connection.commit()

        run(declared, create)
        assert catalog_of(scratch_database, schema) == catalog_of(declared, schema)
    finally:
        postgres.drop_database(postgres_admin_url, name)


SUCCEEDED_JOB = """
    INSERT INTO creation.jobs (
        job_id, user_id, model_id, style_id, provider_code, provider_model, price_points,
        input_asset_id, prompt, negative_prompt, width, height, status, progress, step,
        attempt, max_attempts, next_attempt_at, lease_epoch, provider_request_id,
        output_asset_id, request_hash, created_at, started_at, completed_at, updated_at)
    SELECT :job_id, 'u1', model_id, 'watercolor', provider_code, provider_model, 5,
        gen_random_uuid(), '', '', 512, 512, 'succeeded', 100, 'done',
        1, 3, now(), 1, 'req-1', :output, '', now(), now(), now(), now()
    FROM creation.models ORDER BY sort_order LIMIT 1
"""


def test_outputs_migrate_from_the_single_output_column_and_back(scratch_database: str) -> None:
    """0006 turns a job's one output into a list of one (num_outputs 1), and its downgrade
    turns it back."""
    migrations.upgrade("creation", scratch_database, "0005")
    job_id, output = str(uuid.uuid4()), str(uuid.uuid4())

    def insert(connection: Connection) -> None:
        connection.execute(text(SUCCEEDED_JOB), {"job_id": job_id, "output": output})
        connection.commit()

    run(scratch_database, insert)
    migrations.upgrade("creation", scratch_database)

    def listed(connection: Connection) -> object:
        return connection.execute(
            text("SELECT num_outputs, outputs FROM creation.jobs WHERE job_id = :j"),
            {"j": job_id},
        ).one()

    assert tuple(run(scratch_database, listed)) == (1, [output])  # type: ignore[arg-type]
    migrations.downgrade("creation", scratch_database, "0005")

    def single(connection: Connection) -> object:
        return connection.execute(
            text("SELECT output_asset_id::text FROM creation.jobs WHERE job_id = :j"),
            {"j": job_id},
        ).scalar_one()

    assert run(scratch_database, single) == output


RUNNING_JOB = """
    INSERT INTO creation.jobs (
        job_id, user_id, model_id, style_id, provider_code, provider_model, price_points,
        input_asset_id, prompt, negative_prompt, width, height, status, progress, step,
        attempt, max_attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at,
        provider_request_id, request_hash, created_at, started_at, updated_at)
    SELECT :job_id, 'u1', model_id, 'watercolor', provider_code, provider_model, 5,
        gen_random_uuid(), '', '', 512, 512, 'running', 50, 'generating',
        1, 3, now(), 'w1', 1, now(), 'req-' || gen_random_uuid(), '', now(), now(), now()
    FROM creation.models ORDER BY sort_order LIMIT 1
"""


def test_an_attempt_ending_without_success_lists_its_outputs_for_purging(
    scratch_database: str,
) -> None:
    """The trigger of 0006: an attempt with a provider request that fails, is cancelled
    (running, or queued to resume) or is retried afresh lists (job, attempt) once; one
    that is handed back (request kept) or succeeds lists nothing."""
    migrations.upgrade("creation", scratch_database)
    released = "lease_owner = NULL, lease_expires_at = NULL"
    handed_back = f"status = 'queued', {released}"
    cases = {
        "failed": (
            [f"status = 'failed', {AN_ERROR}, completed_at = now(), {released}"],
            1,
        ),
        "cancelled": ([f"status = 'cancelled', completed_at = now(), {released}"], 1),
        "retried afresh": ([f"{handed_back}, provider_request_id = NULL, step = NULL"], 1),
        "handed back": ([handed_back], 0),
        "cancelled while queued to resume": (
            [handed_back, "status = 'cancelled', completed_at = now()"],
            1,
        ),
        "succeeded": (
            [
                f"status = 'succeeded', step = 'done', progress = 100, outputs = ARRAY['a'],"
                f" completed_at = now(), num_outputs = 1, {released}"
            ],
            0,
        ),
    }

    def play(connection: Connection) -> dict[str, int]:
        listed = {}
        for name, (changes, _) in cases.items():
            job_id = str(uuid.uuid4())
            connection.execute(text(RUNNING_JOB), {"job_id": job_id})
            for change in changes:
                connection.execute(
                    text(f"UPDATE creation.jobs SET {change} WHERE job_id = :j"), {"j": job_id}
                )
            found = connection.execute(
                text("SELECT attempt, user_id FROM creation.output_purges WHERE job_id = :j"),
                {"j": job_id},
            ).all()
            assert found in ([], [(1, "u1")])
            listed[name] = len(found)
        connection.commit()
        return listed

    assert run(scratch_database, play) == {name: listed for name, (_, listed) in cases.items()}


SUBMIT_SIGNATURES = """
    SELECT pg_get_function_identity_arguments(p.oid)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'creation' AND p.proname = 'submit_job'
"""


def _submit_call(trace_parent: bool, payload: bool = False) -> str:
    """A named-argument call of creation.submit_job that makes a job (with 0008's extra
    argument when ``trace_parent``; with the payload argument the job's triggers replaced
    in 0018 when ``payload``)."""
    extra = ", p_trace_parent => :trace_parent" if trace_parent else ""
    given = "p_payload => '{}', " if payload else ""
    return f"""
        SELECT submit_outcome, (job).job_id::text FROM creation.submit_job(
          p_job_id => gen_random_uuid(), p_user_id => :user_id, p_idempotency_key => NULL,
          p_model_id => 'stub-fast', p_style_id => 'watercolor',
          p_input_asset_id => gen_random_uuid(), p_prompt => '', p_negative_prompt => '',
          p_width => 512, p_height => 512, p_parameters => '{{}}', p_max_attempts => 3,
          p_request_hash => repeat('0', 64), p_day_start => now() - interval '1 day',
          p_daily_quota => 100, p_in_flight_limit => 100, p_welcome_points => 100,
          {given}p_now => now(), p_num_outputs => 1{extra})
    """


def test_0008_replaces_the_submit_function_and_its_downgrade_restores_0007s(
    scratch_database: str,
) -> None:
    """0008's submit_job takes the submit's traceparent and keeps it with the job, in place
    of 0007's (one function, never two overloads); its downgrade brings 0007's back."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    migrations.upgrade("creation", scratch_database)

    def submit_traced(connection: Connection) -> tuple[list[str], object]:
        signatures = list(connection.execute(text(SUBMIT_SIGNATURES)).scalars())
        outcome, job_id = connection.execute(
            text(_submit_call(True)), {"user_id": "u-traced", "trace_parent": traceparent}
        ).one()
        assert outcome == "ok"
        stored = connection.execute(
            text("SELECT trace_parent FROM creation.jobs WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
        connection.commit()
        return signatures, stored

    signatures, stored = run(scratch_database, submit_traced)  # type: ignore[misc]
    assert stored == traceparent
    assert len(signatures) == 1
    # Head has more arguments after it (p_via, migration 0025).
    assert "p_num_outputs integer, p_trace_parent text" in signatures[0]

    migrations.downgrade("creation", scratch_database, "0007")

    def submit_untraced(connection: Connection) -> tuple[list[str], str, bool]:
        signatures = list(connection.execute(text(SUBMIT_SIGNATURES)).scalars())
        outcome, _ = connection.execute(
            text(_submit_call(False, payload=True)), {"user_id": "u-0007"}
        ).one()
        column = connection.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE"
                " table_schema = 'creation' AND table_name = 'jobs'"
                " AND column_name = 'trace_parent')"
            )
        ).scalar_one()
        connection.commit()
        return signatures, outcome, column

    signatures, outcome, column = run(scratch_database, submit_untraced)  # type: ignore[misc]
    assert outcome == "ok"
    assert not column
    assert len(signatures) == 1
    assert signatures[0].endswith("p_num_outputs integer")
    migrations.upgrade("creation", scratch_database)
    assert differences(scratch_database, "creation") == []


JOB_ENTRY = """
    INSERT INTO creation.points_ledger (user_id, job_id, kind, amount, reason, created_at)
    VALUES (:user_id, :job_id, :kind, 5, 'test', now())
"""
GRANT_ENTRY = """
    INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
    VALUES (:user_id, 'grant', :amount, :key, 'test', now())
"""


def _sums_and_totals(url: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    def read(connection: Connection) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        sums = [tuple(r) for r in connection.execute(text(LEDGER_SUMS))]
        totals = [tuple(r) for r in connection.execute(text(LEDGER_TOTALS))]
        return sums, totals

    return run(url, read)  # type: ignore[return-value]


def test_0013_backfills_the_ledger_totals_and_its_downgrade_restores_0008s_submit(
    scratch_database: str,
) -> None:
    """Entries made before 0013 are in its totals; after it the trigger keeps them; its
    downgrade drops the totals and brings back the submit that sums the ledger."""
    migrations.upgrade("creation", scratch_database, "0012")

    def fill(connection: Connection) -> None:
        made: dict[str, list[str]] = {}
        for user in ("u-a", "u-b"):
            for _ in range(3):
                outcome, job_id = connection.execute(
                    text(_submit_call(True, payload=True)), {"user_id": user, "trace_parent": None}
                ).one()
                assert outcome == "ok"
                made.setdefault(user, []).append(job_id)
        connection.execute(
            text(JOB_ENTRY), {"user_id": "u-a", "job_id": made["u-a"][0], "kind": "capture"}
        )
        connection.execute(
            text(JOB_ENTRY), {"user_id": "u-b", "job_id": made["u-b"][0], "kind": "release"}
        )
        connection.execute(text(GRANT_ENTRY), {"user_id": "u-a", "amount": 40, "key": "op:promo"})
        connection.execute(text(GRANT_ENTRY), {"user_id": "u-c", "amount": 7, "key": "op:promo"})
        connection.commit()

    run(scratch_database, fill)
    migrations.upgrade("creation", scratch_database)
    sums, totals = _sums_and_totals(scratch_database)
    assert (
        totals
        == sums
        == [
            ("u-a", 140, 15, 5, 0, True),
            ("u-b", 100, 15, 0, 5, True),
            ("u-c", 7, 0, 0, 0, False),
        ]
    )

    def submit(user: str, payload: bool = False) -> object:
        def go(connection: Connection) -> object:
            outcome, _ = connection.execute(
                text(_submit_call(True, payload)), {"user_id": user, "trace_parent": None}
            ).one()
            connection.commit()
            return outcome

        return go

    # u-c's first submit brings the welcome: 107 - 5 left.
    assert run(scratch_database, submit("u-c")) == "ok"
    sums, totals = _sums_and_totals(scratch_database)
    assert totals == sums
    assert sums[2] == ("u-c", 107, 5, 0, 0, True)

    migrations.downgrade("creation", scratch_database, "0012")

    def after_downgrade(connection: Connection) -> tuple[bool, str]:
        table = connection.execute(
            text("SELECT to_regclass('creation.ledger_totals') IS NOT NULL")
        ).scalar_one()
        source = connection.execute(
            text("SELECT prosrc FROM pg_proc WHERE oid = 'creation.submit_job'::regproc")
        ).scalar_one()
        return table, source

    table, source = run(scratch_database, after_downgrade)  # type: ignore[misc]
    assert not table
    assert "ledger_totals" not in source
    assert "FROM creation.points_ledger" in source
    # 0008's submit, summing the ledger
    assert run(scratch_database, submit("u-b", payload=True)) == "ok"
    migrations.upgrade("creation", scratch_database)
    sums, totals = _sums_and_totals(scratch_database)
    assert totals == sums
    assert sums[1] == ("u-b", 100, 20, 0, 5, True)
    assert differences(scratch_database, "creation") == []
