"""The hot job queries ride their partial indexes even under a generic plan.

Each statement is captured as the store really sends it, prepared on its own connection,
and explained with ``plan_cache_mode = force_generic_plan`` — the plan a pooled connection
settles on after a few executions. A status bound as a parameter would hide its value from
that plan, and PostgreSQL could not use an index whose predicate names the status. Sequential
scans are switched off so the verdict does not depend on how many rows the table holds.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Status
from services.creation.job_errors import job_error
from services.creation.list_filter import JobFilter
from services.creation.store import admin, leases, outbox, remote
from services.creation.store import jobs as job_store
from services.creation.store.fenced import CLAIM_SQL, FAIL_SQL, HAND_BACK_SQL, FencedWrite
from services.creation.store.ledger_entries import FIRST_PAGE, NEXT_PAGE
from services.creation.store.submit_statement import submit_arguments
from services.kit.db import asyncpg_url
from tests.integration.creation.helpers import LIMITS, T0, new_user


@pytest.fixture
async def capturing(creation_url: str) -> AsyncIterator[tuple[AsyncEngine, list[tuple[str, Any]]]]:
    """An engine that records every statement it sends, with its parameters."""
    engine = create_async_engine(asyncpg_url(creation_url))
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield engine, sent
    await engine.dispose()


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        # An array as its text form; the statement's cast gives it its type.
        return "'{" + ",".join(f'"{v}"' for v in value) + "}'"
    if isinstance(value, datetime | date | uuid.UUID | str):
        return "'" + str(value).replace("'", "''") + "'"
    raise TypeError(f"no literal for {type(value).__name__}")


async def generic_plan(engine: AsyncEngine, statement: str, parameters: Any) -> str:
    """The generic plan of ``statement`` as PostgreSQL would cache it."""
    name = f"plan_{uuid.uuid4().hex[:8]}"
    async with engine.connect() as connection:
        await connection.execute(text("SET plan_cache_mode = force_generic_plan"))
        await connection.execute(text("SET enable_seqscan = off"))
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        # A statement may start with its parameter types: "(uuid, text) AS SELECT ...".
        typed = statement.startswith("(")
        await driver.execute(f"PREPARE {name}{'' if typed else ' AS'} {statement}")
        arguments = ", ".join(_literal(v) for v in parameters or ())
        call = f"EXECUTE {name}({arguments})" if arguments else f"EXECUTE {name}"
        rows = await driver.fetch(f"EXPLAIN {call}")
        await driver.execute(f"DEALLOCATE {name}")
        await connection.rollback()
    return "\n".join(row[0] for row in rows)


def one_statement(sent: list[tuple[str, Any]], wanted: Callable[[str], bool]) -> tuple[str, Any]:
    found = [(s, p) for s, p in sent if wanted(s)]
    assert len(found) == 1, [s for s, _ in sent]
    return found[0]


async def test_claim_rides_the_claim_queue_index(engine: AsyncEngine) -> None:
    # Sent straight through asyncpg (as leases.claim sends it), with its parameters.
    now = T0 - timedelta(days=3650)
    parameters = (now, "plan-worker", 8, now + timedelta(seconds=30))
    plan = await generic_plan(engine, CLAIM_SQL, parameters)
    assert "ix_jobs_claim_queue" in plan


async def test_ledger_pages_ride_the_users_sequence_index(engine: AsyncEngine) -> None:
    first = FIRST_PAGE.args(user_id="u", limit=21)
    after = NEXT_PAGE.args(user_id="u", entry_id=7, limit=21)
    for statement, arguments in ((FIRST_PAGE, first), (NEXT_PAGE, after)):
        plan = await generic_plan(engine, statement.sql, arguments)
        assert "ix_points_ledger_user_sequence" in plan, plan


async def test_every_fenced_write_rides_the_primary_key(engine: AsyncEngine) -> None:
    job_id = str(uuid.uuid4())
    parameters = (T0, [job_id], [1], ["value"])
    for write in FencedWrite:
        plan = await generic_plan(engine, write.value, parameters)
        assert "pk_jobs" in plan, (write.name, plan)
    one = (T0, job_id, 1)
    answer = job_error("CODE", True)
    fail = (*one, "CODE", "message", True, T0, answer.reason, answer.retryable)
    for name, statement, arguments in (
        ("fail", FAIL_SQL, fail),
        ("hand back", HAND_BACK_SQL, (*one, T0)),
    ):
        plan = await generic_plan(engine, statement, arguments)
        assert "pk_jobs" in plan, (name, plan)


async def test_reaper_rides_the_lease_expiry_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
) -> None:
    engine, sent = capturing
    [r.job for r in await leases.reap_decided(engine, T0 - timedelta(days=3650), 8)]
    statement, parameters = one_statement(sent, lambda s: "lease_expires_at <" in s)
    assert "ix_jobs_lease_expiry" in await generic_plan(engine, statement, parameters)


async def _submit_statement(engine: AsyncEngine) -> str:
    """The statement creation.submit_job runs after taking the user's lock, as PL/pgSQL
    prepares it (each argument a parameter), led by those parameters' types."""
    async with engine.connect() as connection:
        found = (
            await connection.execute(
                text(
                    "SELECT p.prosrc, p.proargnames[1:p.pronargs] AS names,"
                    " ARRAY(SELECT format_type(t.oid, NULL) FROM unnest(p.proargtypes)"
                    "  WITH ORDINALITY AS t(oid, n) ORDER BY t.n) AS types"
                    " FROM pg_proc p WHERE p.oid = 'creation.submit_job'::regproc"
                )
            )
        ).one()
    body = found.prosrc.split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    for position, name in enumerate(found.names, start=1):
        body = re.sub(rf"\b{name}\b", f"${position}", body)
    return f"({', '.join(found.types)}) AS {body}"


async def test_in_flight_count_rides_the_in_flight_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
) -> None:
    engine, _ = capturing
    job_id = str(uuid.uuid4())
    arguments = submit_arguments(
        job_id=job_id,
        user_id=new_user(),
        idempotency_key=None,
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id=str(uuid.uuid4()),
        prompt="p",
        negative_prompt="",
        width=512,
        height=512,
        parameters="{}",
        max_attempts=3,
        request_hash="h",
        day_start=T0,
        daily_quota=LIMITS.daily_quota,
        in_flight_limit=LIMITS.in_flight_limit,
        welcome_points=LIMITS.welcome_points,
        payload="{}",
        now=T0,
        num_outputs=1,
        trace_parent=None,
        via=None,
    )
    statement = await _submit_statement(engine)
    assert "AS in_flight" in statement
    assert "ix_jobs_user_in_flight" in await generic_plan(engine, statement, arguments)


async def test_operators_queue_rides_the_needs_attention_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
) -> None:
    engine, sent = capturing
    await admin.list_attention(engine, 10, None)
    statement, parameters = one_statement(sent, lambda s: "needs_attention" in s)
    assert "ix_jobs_needs_attention" in await generic_plan(engine, statement, parameters)


async def test_the_relay_takes_its_batches_from_the_undelivered_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
) -> None:
    engine, _ = capturing
    # The relay sends this statement on the pool's asyncpg connection, as compiled here.
    arguments = outbox.TAKE.args(now=T0, limit=200)
    assert "SKIP LOCKED" in outbox.TAKE.sql
    plan = await generic_plan(engine, outbox.TAKE.sql, arguments)
    assert "ix_outbox_undelivered" in plan
    # Each taken job's row, whose message it builds, by its primary key.
    assert "pk_jobs" in plan


async def test_the_relay_prunes_through_the_delivered_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
) -> None:
    engine, sent = capturing
    await outbox.prune(engine, T0 - timedelta(days=3650), 1000)
    statement, parameters = one_statement(sent, lambda s: "DELETE FROM creation.outbox" in s)
    assert "ix_outbox_delivered" in await generic_plan(engine, statement, parameters)


@pytest.mark.parametrize(
    ("prune", "table", "index"),
    [
        (remote.prune_claims, "remote_claims", "ix_remote_claims_created"),
        (remote.prune_calls, "remote_calls", "ix_remote_calls_created"),
    ],
)
async def test_the_relay_prunes_remote_claims_and_calls_through_their_created_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]],
    prune: Callable[[AsyncEngine, datetime, int], Awaitable[int]],
    table: str,
    index: str,
) -> None:
    engine, sent = capturing
    await prune(engine, T0 - timedelta(days=3650), 1000)
    statement, parameters = one_statement(sent, lambda s: f"DELETE FROM creation.{table}" in s)
    assert index in await generic_plan(engine, statement, parameters)


@pytest.mark.parametrize(
    ("chosen", "index"),
    [
        (JobFilter((Status.QUEUED, Status.RUNNING)), "ix_jobs_user_status_newest"),
        (
            JobFilter((Status.SUCCEEDED,), T0 - timedelta(days=30), T0),
            "ix_jobs_user_status_newest",
        ),
        (JobFilter(created_from=T0 - timedelta(days=30)), "ix_jobs_user_newest"),
    ],
    ids=["active", "one status in a range", "every status"],
)
async def test_list_jobs_rides_a_per_user_index(
    capturing: tuple[AsyncEngine, list[tuple[str, Any]]], chosen: JobFilter, index: str
) -> None:
    """A page after a cursor, as the second page of a history screen asks for it."""
    engine, sent = capturing
    after = job_store.Cursor(T0, str(uuid.uuid4()))
    await job_store.list_for_user(engine, new_user(), chosen, 20, after)
    statement, parameters = one_statement(sent, lambda s: "FROM creation.jobs" in s)
    plan = await generic_plan(engine, statement, parameters)
    assert index in plan, plan
    # The page starts where the last ended (the cursor is an index condition), and several
    # statuses merge ordered ranges instead of sorting the user's history.
    assert "ROW(created_at, job_id) < ROW(" in plan
    assert ("Merge Append" in plan) is (len(chosen.statuses) > 1)
    assert "Seq Scan" not in plan
