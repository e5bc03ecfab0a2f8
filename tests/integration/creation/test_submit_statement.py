"""The one-statement submit writes what the rest of the store would have written."""

from __future__ import annotations

from google.protobuf import json_format
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.convert import outbox_job
from services.creation.store import jobs as store
from services.creation.tables import outbox
from tests.integration.creation.helpers import LIMITS, T0, command, new_user


async def test_the_first_outbox_payload_is_the_jobs_own_state(engine: AsyncEngine) -> None:
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    async with engine.connect() as connection:
        stored = (
            await connection.execute(select(outbox.c.payload).where(outbox.c.job_id == job.job_id))
        ).scalar_one()
    assert stored == json_format.MessageToDict(outbox_job(job))
    assert stored["status"] == "JOB_STATUS_QUEUED" and stored["version"] == "1"
