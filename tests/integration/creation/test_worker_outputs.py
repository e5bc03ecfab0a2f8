"""A job's outputs as the engine lands them: all of them, in order, under idempotency
keys of the job and attempt, so a repeat lands onto the same assets; an attempt that ends
without success after landing has what it landed deleted (listed by the database in the
same transaction, purged by the worker or, after a crash, by the reaper)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
from datetime import timedelta

import pytest
from PIL import Image
from sqlalchemy import func, select

from services.creation.domain import Status, output_key
from services.creation.media_client import AssetRefused
from services.creation.providers.base import Done, OutputImage, PollResult
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.creation.tables import output_purges
from services.creation.worker import output_purger
from services.kit.clock import system_clock
from tests.integration.creation.helpers import side_rows
from tests.integration.creation.worker_kit import Engine, running
from tests.support.fenced import fenced_write


def picture(shade: int) -> OutputImage:
    image = Image.new("RGB", (64, 48), (shade, 40, 90))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return OutputImage(buffer.getvalue(), "image/png", 64, 48)


async def purges_listed(rig: Engine) -> int:
    async with rig.db.connect() as connection:
        found = await connection.execute(select(func.count()).select_from(output_purges))
        return int(found.scalar_one())


async def test_a_job_of_three_outputs_lands_all_three_in_order(rig: Engine) -> None:
    job = await rig.submit(num_outputs=3)
    assert (job.num_outputs, job.price_points) == (3, 15)
    images = [picture(shade) for shade in (10, 120, 240)]

    async def poll(request_id: str) -> PollResult:
        return Done(images)

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert done.status is Status.SUCCEEDED and len(done.outputs) == 3
    assert rig.provider.requests[0].num_outputs == 3
    for asset_id, image in zip(done.outputs, images, strict=True):
        read = await rig.media_client.read_asset(asset_id, 10_000_000)
        assert read.data == image.data
    assert await rig.outputs(job.user_id) == dict.fromkeys(done.outputs, "ready")
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [("reserve", 15), ("capture", 15)]
    # Landing again under the same keys (a worker that resumed the attempt) changes nothing.
    for index, image in enumerate(images):
        again = await rig.media_client.put_asset(
            job.user_id,
            "ai_output",
            image.content_type,
            image.data,
            idempotency_key=output_key(job.job_id, done.attempt, index),
        )
        assert again == done.outputs[index]
    assert len(await rig.outputs(job.user_id)) == 3


async def test_an_attempt_that_fails_after_landing_deletes_what_it_landed(rig: Engine) -> None:
    """The second output is refused by media after the first landed: the attempt fails
    (no attempts left) and both are deleted (the first ready, the second's reservation
    still uploading); the purge list is empty after."""
    job = await rig.submit(max_attempts=1, num_outputs=2)
    refused = OutputImage(b"not an image at all", "image/png", 64, 48)

    async def poll(request_id: str) -> PollResult:
        return Done([picture(50), refused])

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
        # The attempt purges after its failing write (the job is terminal first): the
        # list empties within the attempt, not by a later sweep (no reaper runs here).
        deadline = time.monotonic() + 15
        while await purges_listed(rig):
            assert time.monotonic() < deadline, "the attempt left its purge listed"
            await asyncio.sleep(0.01)
    assert (done.status, done.error_code, done.outputs) == (Status.FAILED, "OUTPUT_REJECTED", ())
    assert list((await rig.outputs(job.user_id)).values()) == ["deleted", "deleted"]
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [("reserve", 10), ("release", 10)]


async def test_a_retry_after_landing_lands_fresh_assets_and_keeps_none_of_the_first(
    rig: Engine,
) -> None:
    """A retried attempt is a new request: its outputs get keys of their own, and the
    first attempt's landed output is deleted, not reused."""
    job = await rig.submit(max_attempts=2, num_outputs=2)
    answers = [[picture(50), OutputImage(b"broken", "image/png", 64, 48)]]

    async def poll(request_id: str) -> PollResult:
        return Done(answers.pop(0) if answers else [picture(60), picture(70)])

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt, len(done.outputs)) == (Status.SUCCEEDED, 2, 2)
    found = await rig.outputs(job.user_id)
    # The first attempt's landed output and its refused one's reservation.
    assert sorted(found.values()) == ["deleted", "deleted", "ready", "ready"]
    assert {a for a, status in found.items() if status == "ready"} == set(done.outputs)


async def test_a_late_landing_under_a_purged_key_brings_nothing_back(rig: Engine) -> None:
    """After the purge, a stale worker landing the same output again is refused by media
    (the key stays dead), so it cannot leave an asset that nobody would delete."""
    job = await rig.submit(max_attempts=1, num_outputs=2)

    async def poll(request_id: str) -> PollResult:
        return Done([picture(50), OutputImage(b"broken", "image/png", 64, 48)])

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert done.status is Status.FAILED
    data = picture(50).data
    late = rig.media_client.reserve_output(
        job.user_id,
        "image/png",
        len(data),
        hashlib.sha256(data).hexdigest(),
        output_key(job.job_id, done.attempt, 0),
    )
    with pytest.raises(AssetRefused, match="ASSET_DELETED"):
        await late
    assert list((await rig.outputs(job.user_id)).values()) == ["deleted", "deleted"]


async def test_the_sweep_purges_what_a_crashed_worker_left_listed(rig: Engine) -> None:
    """A purge listed but not carried out (the worker died right after ending the
    attempt) is carried out by the sweep, once."""
    job = await rig.submit(max_attempts=1, num_outputs=1)
    key = output_key(job.job_id, 1, 0)
    landed = await rig.media_client.put_asset(
        job.user_id, "ai_output", "image/png", picture(80).data, idempotency_key=key
    )
    async with rig.db.begin() as connection:
        await connection.execute(
            output_purges.insert().values(
                job_id=job.job_id,
                attempt=1,
                user_id=job.user_id,
                num_outputs=1,
                created_at=func.now(),
            )
        )
    assert await output_purger.sweep(rig.db, rig.media_client) == 1
    assert await rig.outputs(job.user_id) == {landed: "deleted"}
    assert await purges_listed(rig) == 0
    assert await output_purger.sweep(rig.db, rig.media_client) == 0


async def test_a_resumable_job_cancelled_while_queued_has_its_landed_output_purged(
    rig: Engine,
) -> None:
    """A worker landed an output and died; the reaper queued the job to resume (request
    kept); the owner cancels it while it waits. Nobody will land or attach anything now:
    the reaper's next sweep deletes what the dead worker landed."""
    job = await rig.submit(num_outputs=1)
    [claimed] = await leases.claim(rig.db, "w-dead", 1, timedelta(seconds=30), system_clock())
    assert claimed.job_id == job.job_id
    await fenced_write(
        rig.db, FencedWrite.RECORD_REQUEST, job.job_id, claimed.lease_epoch, system_clock(), "req-1"
    )
    landed = await rig.media_client.put_asset(
        job.user_id,
        "ai_output",
        "image/png",
        picture(90).data,
        idempotency_key=output_key(job.job_id, claimed.attempt, 0),
    )
    queued = await leases.hand_back(
        rig.db, job.job_id, claimed.lease_epoch, timedelta(hours=1), system_clock()
    )
    assert queued is not None and queued.provider_request_id == "req-1"
    cancelled = await store.cancel(rig.db, job.user_id, job.job_id, system_clock())
    assert cancelled.job.status is Status.CANCELLED
    assert await purges_listed(rig) == 1
    await rig.reaper().sweep()
    assert await rig.outputs(job.user_id) == {landed: "deleted"}
    assert await purges_listed(rig) == 0
