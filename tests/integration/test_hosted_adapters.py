"""The Replicate and fal adapters against the fake vendors (tests/support/fakes, written
from the vendors' documentation): real HTTP, real output files that expire, scripted
throttles, 5xx, failures, cancels and lost submit answers. The worker's side of the same
scenarios is in tests/acceptance/test_replicate_jobs.py and test_fal_jobs.py."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import Image

from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    InputImage,
    PollResult,
    Provider,
    ProviderError,
    Running,
)
from services.creation.providers.fal import FalProvider
from services.creation.providers.hosted.http import PROCESS_HEADER, PROCESS_ID
from services.creation.providers.replicate import ReplicateProvider
from services.creation.settings import ProviderSettings, VendorSettings
from tests.support import pictures
from tests.support.fakes.fal_api import FalFake
from tests.support.fakes.replicate_api import ReplicateFake
from tests.support.fakes.runner import FileHost
from tests.support.fakes.vendor import VendorFake

TOKEN = "r8_integration-token-0123456789"
KEY = "integration-id:integration-secret"
PHOTO = pictures.encode(pictures.scene(48, 32))


@dataclass(frozen=True)
class Case:
    name: str
    fake: VendorFake
    model: str

    def adapter(self, *, key: str | None = None, timeout: float = 5.0) -> Provider:
        if isinstance(self.fake, ReplicateFake):
            vendor = VendorSettings(self.fake.url, TOKEN if key is None else key)
            settings = ProviderSettings(replicate=vendor, request_timeout_seconds=timeout)
            return ReplicateProvider(settings)
        vendor = VendorSettings(self.fake.url, KEY if key is None else key)
        return FalProvider(ProviderSettings(fal=vendor, request_timeout_seconds=timeout))


@pytest.fixture(params=["replicate", "fal"])
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    fake: VendorFake
    if request.param == "replicate":
        fake = ReplicateFake(TOKEN, tag_header=PROCESS_HEADER)
        model = "acme/restyle?image=input_image"
    else:
        fake = FalFake(KEY, tag_header=PROCESS_HEADER)
        model = "fal-ai/flux/dev/image-to-image"
    fake.pace(start_delay=0.05, duration=0.3, steps=6)
    with fake:
        yield Case(request.param, fake, model)


def generation(model: str, **changes: Any) -> GenerationRequest:
    values: dict[str, Any] = {
        "job_id": "job-it",
        "attempt": 1,
        "provider_model": model,
        "style_id": "natural",
        "prompt": "a watercolour fox",
        "negative_prompt": "",
        "width": 48,
        "height": 32,
        "input_image": InputImage(PHOTO, "image/png"),
    }
    values.update(changes)
    return GenerationRequest(**values)


async def poll_to_end(adapter: Provider, request_id: str) -> tuple[list[int], PollResult]:
    """Every progress seen, and how it ended. The fake's generations run on its clock, so
    polling on a short period is how a worker sees them too."""
    seen: list[int] = []
    for _ in range(500):
        result = await adapter.poll(request_id)
        if not isinstance(result, Running):
            return seen, result
        seen.append(result.progress)
        await asyncio.sleep(0.02)  # the provider poll period, as the worker waits it
    raise AssertionError("the generation never ended")


async def test_a_generation_runs_reports_progress_and_its_outputs_are_downloaded(
    case: Case,
) -> None:
    adapter = case.adapter()
    request_id = await adapter.submit(generation(case.model, num_outputs=2), "job-it:1")
    progress, result = await poll_to_end(adapter, request_id)
    assert isinstance(result, Done) and len(result.outputs) == 2
    for output in result.outputs:
        assert output.content_type == "image/png"
        with Image.open(io.BytesIO(output.data)) as image:
            assert image.size == (48, 32) == (output.width, output.height)
    assert progress == sorted(progress) and any(0 < p < 100 for p in progress)
    # Every call said which worker process made it.
    assert {submit.tag for submit in case.fake.submits} == {PROCESS_ID}
    await adapter.close()


async def test_a_model_failure_is_failed_on_the_table(case: Case) -> None:
    adapter = case.adapter()
    case.fake.fail_next("NSFW content detected", error_type="content_policy_violation")
    request_id = await adapter.submit(generation(case.model), "k")
    _, result = await poll_to_end(adapter, request_id)
    assert isinstance(result, Failed)
    assert (result.code, result.retryable) == ("CONTENT_REJECTED", False)
    await adapter.close()


async def test_a_throttled_submit_is_rate_limited_with_the_vendors_delay(case: Case) -> None:
    adapter = case.adapter()
    case.fake.throttle(1, retry_after=3, on=("create",))
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(generation(case.model), "k")
    error = raised.value
    assert (error.code, error.retryable, error.retry_after_seconds) == ("RATE_LIMITED", True, 3.0)
    assert not error.outcome_unknown and case.fake.submit_count() == 0
    await adapter.submit(generation(case.model), "k")
    assert case.fake.submit_count() == 1
    await adapter.close()


async def test_a_5xx_is_a_known_refusal_and_the_next_submit_and_polls_succeed(case: Case) -> None:
    adapter = case.adapter()
    case.fake.server_errors(1, status=503, on=("create",))
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(generation(case.model), "k")
    assert raised.value.code == "UNAVAILABLE" and not raised.value.outcome_unknown
    request_id = await adapter.submit(generation(case.model), "k")
    poll_operation = "get" if case.name == "replicate" else "status"
    case.fake.server_errors(2, status=500, on=(poll_operation,))
    for _ in range(2):
        with pytest.raises(ProviderError) as again:
            await adapter.poll(request_id)
        assert again.value.retryable and not again.value.outcome_unknown
    _, result = await poll_to_end(adapter, request_id)
    assert isinstance(result, Done) and case.fake.submit_count() == 1
    await adapter.close()


async def test_a_cancel_mid_run_stops_the_generation(case: Case) -> None:
    adapter = case.adapter()
    case.fake.hold(progress=50)
    request_id = await adapter.submit(generation(case.model), "k")
    await case.fake.wait_for_async(
        lambda: any(g.held_at is not None for g in case.fake.generations.values())
    )
    seen = await adapter.poll(request_id)
    assert isinstance(seen, Running)
    await adapter.cancel(request_id)
    assert len(case.fake.cancels) == 1
    _, result = await poll_to_end(adapter, request_id)
    assert isinstance(result, Failed) and result.code == "CANCELLED"
    # Cancelling what has ended already is harmless.
    await adapter.cancel(request_id)
    case.fake.release()
    await adapter.close()


async def test_an_output_already_expired_is_output_expired_for_good(case: Case) -> None:
    adapter = case.adapter()
    case.fake.expire_outputs_at_completion()
    request_id = await adapter.submit(generation(case.model), "k")
    _, result = await poll_to_end(adapter, request_id)
    assert isinstance(result, Failed)
    assert (result.code, result.retryable) == ("OUTPUT_EXPIRED", False)
    await adapter.close()


@pytest.mark.parametrize("mode", ["close", "hang"])
async def test_a_lost_submit_answer_is_an_unknown_outcome_and_the_fake_saw_one_submit(
    case: Case, mode: str
) -> None:
    adapter = case.adapter(timeout=0.5)
    case.fake.lose_submit_responses(1, mode=mode, hang_seconds=2)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(generation(case.model), "k")
    assert raised.value.outcome_unknown and raised.value.retryable
    assert case.fake.submit_count() == 1
    await adapter.close()


async def test_a_refused_connection_is_safe_to_submit_again(case: Case) -> None:
    case.fake.stop()
    adapter = case.adapter()
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(generation(case.model), "k")
    assert raised.value.code == "UNAVAILABLE" and not raised.value.outcome_unknown
    await adapter.close()


async def test_another_adapter_instance_resumes_polling_the_same_request(case: Case) -> None:
    """A worker that dies while polling leaves only the request id behind: a new process's
    adapter polls it to the end without submitting again."""
    first = case.adapter()
    request_id = await first.submit(generation(case.model), "k")
    assert isinstance(await first.poll(request_id), Running)
    await first.close()
    second = case.adapter()
    _, result = await poll_to_end(second, request_id)
    assert isinstance(result, Done) and case.fake.submit_count() == 1
    await second.close()


async def test_a_wrong_key_is_auth_rejected_and_never_echoed(case: Case) -> None:
    wrong = "wrong-key-0123456789:abcdef"
    adapter = case.adapter(key=wrong)
    with pytest.raises(ProviderError) as raised:
        await adapter.submit(generation(case.model), "k")
    assert (raised.value.code, raised.value.retryable) == ("AUTH_REJECTED", False)
    assert wrong not in str(raised.value) and TOKEN not in str(raised.value)
    await adapter.close()


async def test_a_signed_input_url_is_fetched_by_the_vendor(case: Case) -> None:
    with FileHost({"photo.png": (PHOTO, "image/png")}) as host:
        adapter = case.adapter()
        request_id = await adapter.submit(
            generation(case.model, input_url=f"{host.url}/photo.png"), "k"
        )
        _, result = await poll_to_end(adapter, request_id)
        assert isinstance(result, Done)
        body = case.fake.submits[0].body
        sent = body.get("input", body)
        assert not any(str(value).startswith("data:") for value in sent.values())
        assert host.fetches == ["photo.png"]
        await adapter.close()
