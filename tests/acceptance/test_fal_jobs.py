"""Jobs of a fal model through the real worker, against a fake of fal's queue API written
from fal's documentation (tests/support/fakes): success, progress, failures, 429 with
Retry-After, 5xx, cancel, an expired output and a lost submit, each seen both on the job
and at the vendor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.dev.stack import Stack
from tests.support import hosted as scenario
from tests.support.hosted import FAL, Hosted, hosted_with_worker


@pytest.fixture(scope="module")
async def fal(api_of_its_own: Stack) -> AsyncIterator[Hosted]:
    async with hosted_with_worker(api_of_its_own, FAL) as running:
        yield running


async def test_a_job_runs_to_the_queue_results_picture(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_job_runs_to_the_vendors_picture(fal, http)
    # The submit named the endpoint; status and result went to the app's own paths.
    assert fal.fake.submits[-1].path == "/fal-ai/flux-pro/kontext"
    generation = fal.fake.submits[-1].generation_id
    assert any(
        r.path.startswith(f"/fal-ai/flux-pro/requests/{generation}/status")
        for r in fal.fake.requests_for("status")
    )


async def test_progress_from_the_queue_logs_reaches_the_job(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.progress_reaches_the_job(fal, http)


async def test_a_content_policy_violation_fails_the_job(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    fal.fake.fail_next(
        "The image was flagged by the safety checker",
        status=422,
        error_type="content_policy_violation",
        retryable=False,
    )
    await scenario.a_provider_failure_fails_the_job(fal, http, "CONTENT_REJECTED")


async def test_a_disconnected_runner_is_tried_again(fal: Hosted, http: httpx.AsyncClient) -> None:
    fal.fake.fail_next("runner disconnected", status=503, error_type="runner_disconnected")
    await scenario.a_retryable_failure_runs_a_second_attempt(fal, http)


async def test_a_throttled_submit_is_sent_again_after_retry_after(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_throttled_submit_waits_retry_after(fal, http)


async def test_a_throttled_status_read_is_sent_again_after_retry_after(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_throttled_poll_waits_retry_after(fal, http)


async def test_server_errors_then_success_queues_one_request(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.server_errors_then_success(fal, http)


async def test_cancelling_a_running_job_cancels_the_queue_request(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.cancel_mid_run_reaches_the_vendor(fal, http)


async def test_an_output_expired_at_completion_fails_the_job(
    fal: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.an_expired_output_fails_the_job(fal, http)


@pytest.mark.parametrize("mode", ["close", "hang"])
async def test_a_lost_submit_answer_needs_attention_and_one_request(
    fal: Hosted, http: httpx.AsyncClient, mode: str
) -> None:
    await scenario.a_lost_submit_needs_attention(fal, http, mode)


async def test_a_refused_key_fails_the_job_for_good(fal: Hosted, http: httpx.AsyncClient) -> None:
    await scenario.a_refused_key_fails_the_job_without_showing_it(fal, http)


def test_the_key_never_reached_the_workers_log(fal: Hosted) -> None:
    """Last in the module: every call above went through this worker."""
    scenario.the_key_is_in_no_log(fal)
