"""A provider's limits in a real worker: the concurrency cap holds with more jobs claimed
than slots, jobs waiting for a slot keep their leases beating and still honour a cancel,
and submits keep to the token bucket's pace."""

from __future__ import annotations

import asyncio
import time

from services.creation.domain import Status, Step
from services.creation.providers.base import Done, GenerationRequest, PollResult, Running
from services.creation.store import jobs as store
from services.kit.clock import system_clock
from tests.integration.creation.worker_kit import Engine, output_png, running, until


class InFlight:
    """Counts the requests the provider holds: from submit until the poll that ends them."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.release = asyncio.Event()

    async def submit(self, request: GenerationRequest, key: str) -> str:
        self.now += 1
        self.peak = max(self.peak, self.now)
        return f"req-{key}"

    async def poll(self, request_id: str) -> PollResult:
        if not self.release.is_set():
            return Running(30)
        self.now -= 1
        return Done([output_png()])


async def test_the_cap_holds_while_more_jobs_are_claimed_than_it_allows(rig: Engine) -> None:
    counter = InFlight()
    rig.provider.on_submit = counter.submit
    rig.provider.on_poll = counter.poll
    jobs = [await rig.submit() for _ in range(6)]
    worker = rig.worker(STUB_MAX_IN_FLIGHT="2", WORKER_CONCURRENCY="6")
    gate = worker.context.limits.gate("stub")
    async with running(worker):
        await until(lambda: len(rig.provider.submits) == 2 and gate.waiting == 4)
        waiting = [
            j for j in jobs if j.job_id not in {job_id for job_id, _ in rig.provider.submits}
        ]
        before = {j.job_id: (await rig.job(j.job_id)).lease_expires_at for j in waiting}
        # The waiting jobs are claimed (RUNNING, nothing submitted) and their leases beat.
        for job in waiting:
            beaten = await rig.until_job(
                job.job_id,
                lambda j, b=before[job.job_id]: (
                    j.lease_expires_at is not None and b is not None and j.lease_expires_at > b
                ),
            )
            assert beaten.status is Status.RUNNING and beaten.provider_request_id is None
        assert len(rig.provider.submits) == 2 and counter.peak == 2
        counter.release.set()
        for job in jobs:
            done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
            assert done.status is Status.SUCCEEDED
    assert counter.peak == 2 and gate.peak_in_flight == 2
    assert len(rig.provider.submits) == 6


async def test_a_job_waiting_for_a_slot_is_cancelled_without_reaching_the_provider(
    rig: Engine,
) -> None:
    counter = InFlight()
    rig.provider.on_submit = counter.submit
    rig.provider.on_poll = counter.poll
    first = await rig.submit()
    worker = rig.worker(STUB_MAX_IN_FLIGHT="1")
    gate = worker.context.limits.gate("stub")
    async with running(worker):
        await rig.until_job(first.job_id, lambda j: j.step is Step.GENERATING)
        second = await rig.submit()
        await until(lambda: gate.waiting == 1)
        await store.cancel(rig.db, second.user_id, second.job_id, system_clock())
        done = await rig.until_job(second.job_id, lambda j: j.status.terminal)
        assert done.status is Status.CANCELLED
        assert worker.context.outcomes[second.job_id] == "cancelled"
        assert [job_id for job_id, _ in rig.provider.submits] == [first.job_id]
        assert gate.waiting == 0
        counter.release.set()
        finished = await rig.until_job(first.job_id, lambda j: j.status.terminal)
    assert finished.status is Status.SUCCEEDED


async def test_submits_keep_to_the_buckets_pace(rig: Engine) -> None:
    stamps: list[float] = []

    async def submit(request: GenerationRequest, key: str) -> str:
        stamps.append(time.monotonic())
        return f"req-{key}"

    rig.provider.on_submit = submit
    jobs = [await rig.submit() for _ in range(5)]
    worker = rig.worker(STUB_RATE="10", STUB_BURST="1", WORKER_CONCURRENCY="5")
    async with running(worker):
        for job in jobs:
            done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
            assert done.status is Status.SUCCEEDED
    stamps.sort()
    # One at once, then one every 0.1 s: the tokens span 0.4 s; each submit follows its
    # token by a database write, whose time varies, so allow that much.
    assert stamps[-1] - stamps[0] >= 0.3, stamps


async def test_a_drain_hands_back_a_job_waiting_for_a_slot_without_a_submit(rig: Engine) -> None:
    counter = InFlight()
    rig.provider.on_submit = counter.submit
    rig.provider.on_poll = counter.poll
    first = await rig.submit()
    worker = rig.worker(STUB_MAX_IN_FLIGHT="1")
    gate = worker.context.limits.gate("stub")
    async with running(worker):
        await rig.until_job(first.job_id, lambda j: j.step is Step.GENERATING)
        second = await rig.submit()
        await until(lambda: gate.waiting == 1)
    # The drain: the waiting job went back to the queue untouched, the polling one kept
    # its request for the next worker.
    waited = await rig.job(second.job_id)
    assert (waited.status, waited.provider_request_id) == (Status.QUEUED, None)
    assert worker.context.outcomes[second.job_id] == "handed_back"
    polled = await rig.job(first.job_id)
    assert polled.status is Status.QUEUED and polled.provider_request_id is not None
    assert [job_id for job_id, _ in rig.provider.submits] == [first.job_id]
