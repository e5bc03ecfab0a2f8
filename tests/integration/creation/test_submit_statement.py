"""The one-statement submit writes what the rest of the store would have written."""

from __future__ import annotations

from google.protobuf import json_format
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.convert import outbox_job
from services.creation.store import jobs as store
from services.creation.store.submit_statement import SUBMIT_CALL
from services.creation.tables import outbox
from services.kit.db import driver_connection
from tests.integration.creation.helpers import LIMITS, T0, command, endpoint_enabled, new_user


async def test_the_first_outbox_row_records_the_change_and_the_relay_builds_the_job(
    engine: AsyncEngine,
) -> None:
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    async with engine.connect() as connection:
        stored = (
            await connection.execute(
                select(
                    outbox.c.version,
                    outbox.c.event_type,
                    outbox.c.payload,
                    outbox.c.webhooks_pending,
                ).where(outbox.c.job_id == job.job_id)
            )
        ).one()
        # What the relay's take statement builds from the job's row.
        built = (
            await connection.execute(
                text("SELECT creation.job_message(j) FROM creation.jobs AS j WHERE job_id = :j"),
                {"j": job.job_id},
            )
        ).scalar_one()
    # No endpoint enabled: the row names the change, and carries no copy of the job.
    assert tuple(stored) == (1, "job.queued", None, False)
    assert built == json_format.MessageToDict(outbox_job(job))
    assert built["status"] == "JOB_STATUS_QUEUED" and built["version"] == "1"


async def test_with_an_endpoint_the_first_outbox_row_is_marked_and_still_keeps_no_copy(
    engine: AsyncEngine,
) -> None:
    # The webhooks' fan-out builds the job's message when it fans the row out (0031).
    async with endpoint_enabled(engine):
        job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    async with engine.connect() as connection:
        stored = (
            await connection.execute(
                select(outbox.c.payload, outbox.c.webhooks_pending).where(
                    outbox.c.job_id == job.job_id
                )
            )
        ).one()
    assert stored.webhooks_pending
    assert stored.payload is None


# PostgreSQL's first object id for user-made objects: every built-in type's oid is below it.
FIRST_NORMAL_OBJECT_ID = 16384


async def test_the_call_returns_built_in_types_only(engine: AsyncEngine) -> None:
    """Each column of the submit call is of a type asyncpg knows without asking: a
    composite (the function's creation.jobs) made every new connection's first submit
    run asyncpg's type introspection query first."""
    async with driver_connection(engine) as connection:
        statement = await connection.prepare(SUBMIT_CALL)
        columns = {a.name: a.type for a in statement.get_attributes()}
    assert "job_id" in columns and "submit_outcome" in columns
    assert {name: t.name for name, t in columns.items() if t.oid >= FIRST_NORMAL_OBJECT_ID} == {}
