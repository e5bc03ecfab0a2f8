"""Drain: a stopping worker claims nothing more, lets its attempts reach a safe point
while their leases keep beating, finishes what it can and hands back the rest (queued,
request id kept) within its deadline — never NEEDS_ATTENTION because of the drain — and
the next worker resumes without a second submit."""

from __future__ import annotations

import asyncio

from services.creation.domain import Status, Step
from services.creation.providers.base import Done, GenerationRequest, PollResult, Running
from tests.integration.creation.helpers import side_rows
from tests.integration.creation.worker_kit import Engine, output_png, running


async def test_a_drain_finishes_or_hands_back_and_the_next_worker_resumes(
    rig: Engine,
) -> None:
    polling, finishing, submitting, waiting = [await rig.submit() for _ in range(4)]
    worker = rig.worker(WORKER_CONCURRENCY="3")
    drain = worker.context.drain
    second_worker = asyncio.Event()

    async def submit(request: GenerationRequest, key: str) -> str:
        if request.job_id == submitting.job_id and not second_worker.is_set():
            await drain.asked.wait()  # the drain begins while this submit is in flight
        return f"req-{key}"

    async def poll(request_id: str) -> PollResult:
        if second_worker.is_set():
            return Done([output_png()])
        if finishing.job_id in request_id and drain.asked.is_set():
            return Done([output_png()])
        return Running(20)

    rig.provider.on_submit = submit
    rig.provider.on_poll = poll
    task = asyncio.create_task(worker.run())
    await rig.until_job(polling.job_id, lambda j: j.step is Step.GENERATING)
    await rig.until_job(finishing.job_id, lambda j: j.step is Step.GENERATING)
    await rig.until_job(submitting.job_id, lambda j: j.step is Step.SUBMITTING)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3
    await worker.stop(deadline)
    await asyncio.wait_for(task, 4)
    assert loop.time() <= deadline + 0.5

    got = {j.job_id: await rig.job(j.job_id) for j in (polling, finishing, submitting, waiting)}
    assert got[finishing.job_id].status is Status.SUCCEEDED
    for job in (polling, submitting):
        back = got[job.job_id]
        assert (back.status, back.attempt, back.provider_request_id, back.lease_owner) == (
            Status.QUEUED,
            1,
            f"req-{job.job_id}:1",
            None,
        )
    # Never claimed: the stopping worker took nothing new.
    assert (got[waiting.job_id].status, got[waiting.job_id].attempt) == (Status.QUEUED, 0)
    assert all(job.status is not Status.NEEDS_ATTENTION for job in got.values())
    assert worker.keeper.held == 0

    second_worker.set()
    async with running(rig.worker()):
        for job in (polling, submitting, waiting):
            done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
            assert done.status is Status.SUCCEEDED
    # One submit per job, whoever ran it.
    submits = [job_id for job_id, _ in rig.provider.submits]
    assert sorted(submits) == sorted(j.job_id for j in (polling, finishing, submitting, waiting))
    for job in (polling, submitting):
        rows = await side_rows(rig.db, job.job_id)
        assert rows["ledger"] == [("reserve", 5), ("capture", 5)]
