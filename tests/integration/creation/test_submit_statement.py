"""The one-statement submit writes what the rest of the store would have written."""

from __future__ import annotations

from google.protobuf import json_format
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.convert import outbox_job
from services.creation.store import jobs as store
from services.creation.store.submit_statement import SUBMIT_CALL
from services.creation.tables import outbox
from services.kit.db import driver_connection
from tests.integration.creation.helpers import LIMITS, T0, command, new_user


async def test_the_first_outbox_payload_is_the_jobs_own_state(engine: AsyncEngine) -> None:
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    async with engine.connect() as connection:
        stored = (
            await connection.execute(select(outbox.c.payload).where(outbox.c.job_id == job.job_id))
        ).scalar_one()
    assert stored == json_format.MessageToDict(outbox_job(job))
    assert stored["status"] == "JOB_STATUS_QUEUED" and stored["version"] == "1"


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
