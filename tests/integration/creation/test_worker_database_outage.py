"""An attempt rides out a database outage shorter than its lease: a write PostgreSQL could
not take is sent again once it answers, so the job keeps its attempt and, above all, the
request id of a submit the provider already accepted (without it the job would wait for
an operator). That id is worth more than the lease: it is sent for as long again after
the lease was given up (its fence refuses it once anybody else took the job), so the
reaper resumes the job instead of an operator deciding it. An outage longer than both
ends the attempt without a second submit. PostgreSQL here is the module's own, frozen on
purpose (SIGSTOP: sockets open, nothing answers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.creation.domain import Job, Status, Step
from services.creation.worker.loop import Worker
from services.kit.clock import system_clock
from services.kit.db import Database
from tests.integration.creation.conftest import empty_job_tables
from tests.integration.creation.test_worker_fail_closed import FAST
from tests.integration.creation.worker_kit import Engine, running, until, worker_stack
from tests.support.pg_outage import OwnPostgres

RETRIED = "atelier_worker_writes_retried_total"
ABANDONED = ("atelier_worker_leases_lost_total", {"why": "abandoned"})


def retried() -> float:
    return REGISTRY.get_sample_value(RETRIED) or 0.0


def abandoned() -> float:
    return REGISTRY.get_sample_value(*ABANDONED) or 0.0


@pytest.fixture
async def frozen_stack(
    own_pg: tuple[OwnPostgres, str], media_url: str, tmp_path: Path
) -> AsyncIterator[tuple[OwnPostgres, Engine]]:
    """The engine on the module's own PostgreSQL (short deadlines), media on the shared
    one; the server is thawed again whatever the test did."""
    pg, url = own_pg
    database = Database(url, "worker-outage-test", limits=FAST)
    try:
        await empty_job_tables(database.engine)
        async with worker_stack(database.engine, url, media_url, tmp_path) as stack:
            yield pg, stack
    finally:
        pg.thaw()
        await database.close()


@asynccontextmanager
async def frozen_after_submit(pg: OwnPostgres, stack: Engine) -> AsyncIterator[tuple[Job, Worker]]:
    """A job and a running worker, PostgreSQL frozen the moment the provider accepted the
    job's submit (before the worker could write the request id)."""
    job = await stack.submit()
    frozen = asyncio.Event()

    def on_point(point: str) -> None:
        if point == "after_submit" and not frozen.is_set():
            pg.freeze()
            frozen.set()

    worker = stack.worker(on_point)
    async with running(worker):
        await asyncio.wait_for(frozen.wait(), 15)
        yield job, worker


async def test_a_freeze_after_the_submit_keeps_the_request_id_and_the_attempt(
    frozen_stack: tuple[OwnPostgres, Engine],
) -> None:
    pg, stack = frozen_stack
    before = retried()
    async with frozen_after_submit(pg, stack) as (job, _):
        # The request id's write failed against the frozen server, twice: sent again.
        await until(lambda: retried() >= before + 2, 15)
        pg.thaw()
        done = await stack.until_job(job.job_id, lambda j: j.status.terminal, 30)
    assert done.status is Status.SUCCEEDED
    assert done.attempt == 1
    assert done.provider_request_id == f"req-{job.job_id}:1"
    assert stack.provider.submits == [(job.job_id, f"{job.job_id}:1")]


async def test_an_outage_a_little_longer_than_the_lease_still_keeps_the_request_id(
    frozen_stack: tuple[OwnPostgres, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    pg, stack = frozen_stack
    caplog.set_level(logging.INFO, "services.creation.worker.attempt")
    lost = abandoned()
    async with frozen_after_submit(pg, stack) as (job, worker):
        # The keeper gives the lease up once beats failed for a lease's length (5 s); the
        # attempt holding the provider's answer goes on sending it.
        await until(lambda: abandoned() > lost, 20)
        assert worker.running == 1
        pg.thaw()
        kept = await stack.until_job(job.job_id, lambda j: j.provider_request_id is not None)
        assert (kept.status, kept.step) == (Status.RUNNING, Step.GENERATING)
        await until(lambda: worker.running == 0, 10)  # the lease is gone: nothing more
        # The reaper finds the lease expired with the request known: it resumes the job,
        # and the worker claims it again and polls the same request.
        await stack.reaper().sweep()
        done = await stack.until_job(job.job_id, lambda j: j.status.terminal, 30)
    assert (done.status, done.attempt) == (Status.SUCCEEDED, 1)
    assert stack.provider.submits == [(job.job_id, f"{job.job_id}:1")]
    said = [r.getMessage() for r in caplog.records]
    assert "request_id_recorded_without_the_lease" in said
    assert "request_id_unrecorded" not in said


async def test_an_outage_longer_than_the_lease_and_as_long_again_leaves_it_to_an_operator(
    frozen_stack: tuple[OwnPostgres, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    pg, stack = frozen_stack
    lost = abandoned()
    async with frozen_after_submit(pg, stack) as (job, worker):
        # The lease given up (5 s of failed beats), the request id sent for 5 s more: then
        # the attempt stops sending it.
        await until(lambda: abandoned() > lost, 20)
        await until(lambda: worker.running == 0, 15)
        pg.thaw()
        still = await stack.job(job.job_id)
        assert (still.status, still.step, still.provider_request_id) == (
            Status.RUNNING,
            Step.SUBMITTING,
            None,
        )
        # Its lease expired unrecorded: the reaper cannot know whether the provider has it.
        reaper = stack.reaper(clock=lambda: system_clock() + timedelta(seconds=60))
        await reaper.sweep()
    decided = await stack.job(job.job_id)
    assert (decided.status, decided.error_code) == (Status.NEEDS_ATTENTION, "OUTCOME_UNKNOWN")
    assert stack.provider.submits == [(job.job_id, f"{job.job_id}:1")]
    # What the operator deciding it needs: the provider's id of the submit, logged.
    unrecorded = [r for r in caplog.records if r.getMessage() == "request_id_unrecorded"]
    assert [r.fields["request_id"] for r in unrecorded] == [f"req-{job.job_id}:1"]  # type: ignore[attr-defined]
