"""Every write a worker makes after its claim is fenced by (job_id, lease_epoch): once
another worker holds the job (the reaper queued it, a new claim bumped the epoch), each of
the first worker's writes matches nothing and changes nothing — not the row, not an event,
not the ledger, not the outbox — while the new holder's writes go through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.leases import Beat
from services.creation.store.rows import job_from_row
from services.creation.tables import jobs
from tests.integration.creation.helpers import LIMITS, T0, command, new_user, side_rows
from tests.support.fenced import fenced_write

TTL = timedelta(seconds=30)
LATER = T0 + TTL * 2
ASSET = "7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90"

StaleWrite = Callable[[AsyncEngine, Job], Awaitable[object]]


async def _beat(engine: AsyncEngine, job: Job) -> object:
    result = await leases.beat(engine, "old", [Beat(job.job_id, job.lease_epoch, 70)], TTL, LATER)
    return result.held or None


STALE_WRITES: dict[str, StaleWrite] = {
    "beat": _beat,
    "heartbeat": lambda e, j: leases.heartbeat(e, j.job_id, j.lease_epoch, TTL, LATER, 70),
    "mark_submitting": lambda e, j: fenced_write(
        e, FencedWrite.MARK_SUBMITTING, j.job_id, j.lease_epoch, LATER
    ),
    "record_request": lambda e, j: fenced_write(
        e, FencedWrite.RECORD_REQUEST, j.job_id, j.lease_epoch, LATER, "req-old"
    ),
    "complete": lambda e, j: fenced_write(
        e, FencedWrite.COMPLETE, j.job_id, j.lease_epoch, LATER, outputs_value([ASSET])
    ),
    "fail": lambda e, j: leases.fail(
        e,
        j.job_id,
        j.lease_epoch,
        "CONTENT_REJECTED",
        "late",
        retryable=False,
        retry_delay=timedelta(0),
        now=LATER,
    ),
    "retry": lambda e, j: leases.fail(
        e,
        j.job_id,
        j.lease_epoch,
        "UNAVAILABLE",
        "late",
        retryable=True,
        retry_delay=timedelta(0),
        now=LATER,
    ),
    "hand_back": lambda e, j: leases.hand_back(e, j.job_id, j.lease_epoch, timedelta(0), LATER),
    "outcome_unknown": lambda e, j: fenced_write(
        e, FencedWrite.OUTCOME_UNKNOWN, j.job_id, j.lease_epoch, LATER, "late"
    ),
    "acknowledge_cancel": lambda e, j: fenced_write(
        e, FencedWrite.ACKNOWLEDGE_CANCEL, j.job_id, j.lease_epoch, LATER
    ),
}


async def _row(engine: AsyncEngine, job_id: str) -> Job:
    async with engine.connect() as connection:
        found = (await connection.execute(select(jobs).where(jobs.c.job_id == job_id))).one()
    return job_from_row(found._mapping)


async def _taken_over(engine: AsyncEngine, cancel: bool) -> tuple[Job, Job]:
    """A job claimed by "old", reaped after its lease expired and claimed by "new": the
    old claim and the job as "new" holds it (with its owner's cancel request, if asked:
    an acknowledgement would otherwise have nothing to acknowledge)."""
    user = new_user()
    await store.submit(engine, user, command(), LIMITS, T0)
    (old,) = await leases.claim(engine, "old", 1, TTL, T0)
    [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 10)]
    (new,) = await leases.claim(engine, "new", 1, TTL, T0 + TTL * 2)
    assert (new.job_id, new.lease_epoch) == (old.job_id, old.lease_epoch + 1)
    if cancel:
        await store.cancel(engine, user, old.job_id, T0 + TTL * 2)
        new = await _row(engine, old.job_id)
        assert (new.status, new.cancel_requested) == (Status.RUNNING, True)
    return old, new


@pytest.mark.parametrize("write", list(STALE_WRITES), ids=list(STALE_WRITES))
async def test_a_write_with_a_stale_epoch_changes_nothing(engine: AsyncEngine, write: str) -> None:
    old, new = await _taken_over(engine, cancel=write == "acknowledge_cancel")
    before = await side_rows(engine, old.job_id)
    assert await STALE_WRITES[write](engine, old) is None
    assert await _row(engine, old.job_id) == new
    assert await side_rows(engine, old.job_id) == before


async def test_the_new_holder_writes_through_after_every_stale_write(engine: AsyncEngine) -> None:
    old, new = await _taken_over(engine, cancel=False)
    for name, write in STALE_WRITES.items():
        if name != "acknowledge_cancel":
            assert await write(engine, old) is None, name
    done = await fenced_write(
        engine, FencedWrite.COMPLETE, new.job_id, new.lease_epoch, LATER, outputs_value([ASSET])
    )
    assert done is not None
    assert (done.status, done.lease_epoch, done.outputs) == (
        Status.SUCCEEDED,
        new.lease_epoch,
        (ASSET,),
    )
    assert (await side_rows(engine, old.job_id))["ledger"] == [("reserve", 5), ("capture", 5)]
