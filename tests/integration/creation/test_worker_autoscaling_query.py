"""The query KEDA runs to scale the workers (deploy/k8s/base/worker-autoscaling.yaml):
it runs on creation's migrated schema, counts the work there is (due queued jobs and
running ones, not a retry still waiting out its backoff nor a finished job), and rides
the partial indexes rather than reading the table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import jobs as store
from tests.integration.creation.helpers import LIMITS, T0, command, new_user

pytestmark = pytest.mark.integration

AUTOSCALING = Path(__file__).resolve().parents[3] / "deploy/k8s/base/worker-autoscaling.yaml"


def scaler_query() -> str:
    for doc in yaml.safe_load_all(AUTOSCALING.read_text()):
        if doc["kind"] == "ScaledObject":
            [trigger] = doc["spec"]["triggers"]
            return str(trigger["metadata"]["query"])
    raise AssertionError("no ScaledObject")


async def test_the_scaler_counts_due_and_running_jobs(engine: AsyncEngine) -> None:
    user = new_user()
    made = [(await store.submit(engine, user, command(), LIMITS, T0)).job.job_id for _ in range(7)]
    # Distinct counts, so each wrong query gives a wrong answer.
    due, running, backing_off, finished = made[:3], made[3:5], made[5], made[6]
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE creation.jobs SET status = 'running', lease_owner = 'w1',"
                " lease_expires_at = now() + interval '1 minute', started_at = now(),"
                " step = 'submitting', attempt = 1, lease_epoch = 1 WHERE job_id = ANY(:ids)"
            ),
            {"ids": running},
        )
        await connection.execute(
            text(
                "UPDATE creation.jobs SET next_attempt_at = now() + interval '1 hour'"
                " WHERE job_id = :id"
            ),
            {"id": backing_off},
        )
        await connection.execute(
            text(
                "UPDATE creation.jobs SET status = 'cancelled', completed_at = now()"
                " WHERE job_id = :id"
            ),
            {"id": finished},
        )
    async with engine.connect() as connection:
        counted = (await connection.execute(text(scaler_query()))).scalar_one()
    assert counted == len(due) + len(running)


async def test_the_scaler_query_rides_the_partial_indexes(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(
            row[0] for row in await connection.execute(text(f"EXPLAIN {scaler_query()}"))
        )
    assert "Seq Scan" not in plan, plan
