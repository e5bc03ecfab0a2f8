"""A provider's Retry-After on a poll: the worker asks again no sooner than it was told,
and a wait longer than an attempt may hold its slot hands the job back with that delay,
keeping its request."""

from __future__ import annotations

import time
from datetime import timedelta

from services.creation.domain import Status
from services.creation.providers.base import Done, PollResult, ProviderError
from tests.integration.creation.worker_kit import Engine, output_png, running


async def test_a_throttled_poll_is_asked_again_after_retry_after(rig: Engine) -> None:
    stamps: list[float] = []

    async def poll(request_id: str) -> PollResult:
        stamps.append(time.monotonic())
        if len(stamps) == 1:
            raise ProviderError("RATE_LIMITED", "HTTP 429", retryable=True, retry_after_seconds=0.8)
        return Done([output_png()])

    rig.provider.on_poll = poll
    job = await rig.submit()
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert done.status is Status.SUCCEEDED and len(rig.provider.submits) == 1
    # The engine's own backoff here is at most 0.1-0.2 s: the wait is the provider's.
    assert stamps[1] - stamps[0] >= 0.8, stamps


async def test_a_long_retry_after_hands_the_job_back_with_its_request(rig: Engine) -> None:
    async def poll(request_id: str) -> PollResult:
        raise ProviderError("RATE_LIMITED", "HTTP 429", retryable=True, retry_after_seconds=120)

    rig.provider.on_poll = poll
    job = await rig.submit()
    worker = rig.worker()
    async with running(worker):
        queued = await rig.until_job(
            job.job_id, lambda j: j.status is Status.QUEUED and j.provider_request_id is not None
        )
    assert worker.context.outcomes[job.job_id] == "handed_back"
    assert queued.next_attempt_at is not None and queued.updated_at is not None
    assert queued.next_attempt_at - queued.updated_at >= timedelta(seconds=119)
    assert len(rig.provider.submits) == 1 and len(rig.provider.polls) == 1
