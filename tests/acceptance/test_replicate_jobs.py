"""Jobs of a Replicate model through the real worker, against a fake of Replicate's
predictions API written from Replicate's documentation (tests/support/fakes): success,
progress, failures, 429 with Retry-After, 5xx, cancel, an expired output and a lost
submit, each seen both on the job and at the vendor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.dev.stack import Stack
from tests.support import hosted as scenario
from tests.support.hosted import REPLICATE, Hosted, hosted_with_worker


@pytest.fixture(scope="module")
async def replicate(api_of_its_own: Stack) -> AsyncIterator[Hosted]:
    async with hosted_with_worker(api_of_its_own, REPLICATE) as running:
        yield running


async def test_a_job_runs_to_the_predictions_picture(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_job_runs_to_the_vendors_picture(replicate, http)
    # The seeded row names an official model: the create went to its route.
    assert (
        replicate.fake.submits[-1].path
        == "/v1/models/black-forest-labs/flux-kontext-pro/predictions"
    )


async def test_a_64_bit_seed_reaches_the_prediction_exactly(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    """JSON (a string, as int64 is in JSON) through Envoy, gRPC, the job row and the
    worker to the vendor's input: 2^63-1 is not rounded to a double on the way."""
    seed = 2**63 - 1
    job = await scenario.submit(replicate, http, parameters={"seed": {"intValue": str(seed)}})
    done = await scenario.final(replicate, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert done["parameters"] == {"seed": {"intValue": str(seed)}}
    [submitted] = replicate.submits_for(job.marker)
    sent = submitted.body["input"]["seed"]
    assert type(sent) is int and sent == seed


async def test_progress_from_the_prediction_logs_reaches_the_job(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.progress_reaches_the_job(replicate, http)


async def test_a_failed_prediction_fails_the_job(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    replicate.fake.fail_next("Prediction failed: the model raised ValueError")
    await scenario.a_provider_failure_fails_the_job(replicate, http, "INTERNAL")


async def test_a_flagged_prediction_is_content_rejected(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    replicate.fake.fail_next(
        "NSFW content detected. Try running it again, or try a different prompt."
    )
    await scenario.a_provider_failure_fails_the_job(replicate, http, "CONTENT_REJECTED")


async def test_an_out_of_memory_prediction_is_tried_again(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    replicate.fake.fail_next("CUDA out of memory. Tried to allocate 2.00 GiB")
    await scenario.a_retryable_failure_runs_a_second_attempt(replicate, http)


async def test_a_throttled_create_is_sent_again_after_retry_after(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_throttled_submit_waits_retry_after(replicate, http)


async def test_a_throttled_prediction_read_is_sent_again_after_retry_after(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_throttled_poll_waits_retry_after(replicate, http)


async def test_server_errors_then_success_creates_one_prediction(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.server_errors_then_success(replicate, http)


async def test_cancelling_a_running_job_cancels_the_prediction(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.cancel_mid_run_reaches_the_vendor(replicate, http)


async def test_an_output_expired_at_completion_fails_the_job(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.an_expired_output_fails_the_job(replicate, http)


@pytest.mark.parametrize("mode", ["close", "hang"])
async def test_a_lost_create_answer_needs_attention_and_one_prediction(
    replicate: Hosted, http: httpx.AsyncClient, mode: str
) -> None:
    await scenario.a_lost_submit_needs_attention(replicate, http, mode)


async def test_a_refused_key_fails_the_job_for_good(
    replicate: Hosted, http: httpx.AsyncClient
) -> None:
    await scenario.a_refused_key_fails_the_job_without_showing_it(replicate, http)


def test_the_key_never_reached_the_workers_log(replicate: Hosted) -> None:
    """Last in the module: every call above went through this worker."""
    scenario.the_key_is_in_no_log(replicate)
