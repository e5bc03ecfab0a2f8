"""The deliverer's pruning: deliveries done for longer than the retention go, and so does a
per-job endpoint (SubmitJob's webhook) once its job has been done for that long and nothing
of it is pending — so the endpoints table does not grow by a row for every such job."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import webhook_deliveries
from services.kit.db import driver_connection
from tests.integration.creation.webhook_kit import (
    change,
    endpoint,
    fan_out,
    reset,
    rows,
    submit,
)

RETENTION = 30 * 86400.0
CANCEL = """
    UPDATE creation.jobs SET status = 'cancelled', version = version + 1,
        completed_at = now(), lease_owner = NULL, lease_expires_at = NULL
    WHERE job_id = $1::uuid
"""


async def per_job_endpoint(engine: AsyncEngine, job_id: str) -> str:
    endpoint_id = str(uuid.uuid4())
    async with driver_connection(engine) as connection:
        await connection.execute(
            "INSERT INTO creation.webhook_endpoints (endpoint_id, url, event_types, job_id,"
            " signing_owner, created_by) VALUES ($1, 'https://shop.example/hooks',"
            " '{job.cancelled}', $2, 'shop', 'shop')",
            endpoint_id,
            job_id,
        )
    return endpoint_id


async def test_a_per_job_endpoint_goes_once_its_job_is_long_done_and_nothing_is_pending(
    engine: AsyncEngine,
) -> None:
    await reset(engine)
    long_done, lately_done, pending, running = await submit(engine, 4)
    registered, _ = await endpoint(engine, "https://shop.example/all", ["job.cancelled"])
    hooks = {
        job: await per_job_endpoint(engine, job)
        for job in (long_done, lately_done, pending, running)
    }
    for job in (long_done, lately_done, pending):
        await change(engine, CANCEL, job)
    await fan_out(engine)
    async with driver_connection(engine) as connection:
        # Delivered long ago, except the one still pending; the jobs' last change 40 days
        # back, but the lately done one's (moving no version writes nothing else).
        await connection.execute(
            "UPDATE creation.webhook_deliveries SET state = 'succeeded', attempts = 1,"
            " completed_at = now() - interval '40 days' WHERE job_id <> $1::uuid",
            pending,
        )
        await connection.execute(
            "UPDATE creation.jobs SET updated_at = now() - interval '40 days'"
            " WHERE job_id <> $1::uuid",
            lately_done,
        )
        deleted = await webhook_deliveries.prune(connection, RETENTION, 1000)

    left = {r["endpoint_id"] for r in await rows_of_endpoints(engine)}
    assert hooks[long_done] not in left
    assert {hooks[lately_done], hooks[pending], hooks[running], registered} <= left
    # Each cancel wrote two deliveries (the registered endpoint's and the job's own): the
    # four done long ago were pruned, the pending job's two stay.
    assert deleted == (4, 1)
    assert [str(d["job_id"]) for d in await rows(engine)] == [pending, pending]


async def rows_of_endpoints(engine: AsyncEngine) -> list[dict[str, str]]:
    async with driver_connection(engine) as connection:
        found = await connection.fetch("SELECT endpoint_id::text FROM creation.webhook_endpoints")
    return [dict(r) for r in found]
