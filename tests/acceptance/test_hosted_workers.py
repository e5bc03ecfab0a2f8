"""Hosted-vendor jobs on workers each test starts for itself:

- a worker killed with SIGKILL while it polls: the next worker finds the expired lease and
  resumes polling the same prediction (Replicate) or queue request (fal); the vendor sees
  one submit, polls from both processes, and the job ends with the vendor's picture;
- a worker refuses to start while an enabled model's vendor has no key, naming the model
  and the setting (and no key it does have);
- a worker told the vendors can reach media (ATELIER_PROVIDER_INPUT=url) hands the vendor
  media's signed URL, which the vendor fetches, instead of the photo inline."""

from __future__ import annotations

import signal

import httpx
import pytest

from services.dev.stack import Stack
from tests.support import pictures
from tests.support.hosted import (
    FAL,
    REPLICATE,
    Vendor,
    enable_models,
    final,
    hosted_alone,
    styled,
    submit,
)
from tests.support.workers import exited, serving


@pytest.mark.parametrize("vendor", [REPLICATE, FAL], ids=lambda vendor: vendor.code)
async def test_a_worker_killed_while_polling_is_resumed_on_the_same_request(
    api_of_its_own: Stack, http: httpx.AsyncClient, vendor: Vendor
) -> None:
    async with hosted_alone(api_of_its_own, vendor) as hosted:
        fake = hosted.fake
        fake.hold(progress=40)
        doomed = hosted.start_worker(f"{vendor.code}-doomed")
        await serving(doomed)
        job = await submit(hosted, http)

        def polled_by(tag: str | None, other: bool = False) -> bool:
            submits = hosted.submits_for(job.marker)
            return bool(submits) and any(
                r.operation == vendor.poll
                and submits[0].generation_id in r.path
                and (r.tag != tag if other else r.tag == tag)
                for r in fake.requests
            )

        await fake.wait_for_async(lambda: len(hosted.submits_for(job.marker)) == 1)
        [first] = hosted.submits_for(job.marker)
        assert first.tag, "the adapter names its process on every call"
        await fake.wait_for_async(lambda: polled_by(first.tag))
        doomed.send(signal.SIGKILL)
        assert await exited(doomed, within=10) == -signal.SIGKILL

        survivor = hosted.start_worker(f"{vendor.code}-survivor")
        await serving(survivor)
        # The survivor polls the dead worker's request (after the lease expires).
        await fake.wait_for_async(lambda: polled_by(first.tag, other=True), within=30)
        fake.release()
        done = await final(hosted, http, job)

    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    assert [s.generation_id for s in hosted.submits_for(job.marker)] == [first.generation_id]
    assert done["attempt"] == 1  # resumed, not retried
    assert fake.cancels == []
    [output] = done["outputs"]
    picture = pictures.decode((await http.get(output["url"])).content)
    assert pictures.mean_difference(picture, styled(job.photo)) < 2


@pytest.mark.parametrize("vendor", [REPLICATE, FAL], ids=lambda vendor: vendor.code)
async def test_the_vendor_fetches_the_photo_from_medias_signed_url(
    api_of_its_own: Stack, http: httpx.AsyncClient, vendor: Vendor
) -> None:
    api = api_of_its_own
    async with hosted_alone(api, vendor) as hosted:
        worker = hosted.start_worker(f"{vendor.code}-by-url", ATELIER_PROVIDER_INPUT="url")
        await serving(worker)
        job = await submit(hosted, http)
        done = await final(hosted, http, job)
    assert done["status"] == "JOB_STATUS_SUCCEEDED", done
    [sent] = hosted.submits_for(job.marker)
    body = sent.body.get("input", sent.body)
    image_ref = str(body["input_image" if vendor is REPLICATE else "image_url"])
    # media's signed URL, through the edge as any outsider would fetch it.
    assert image_ref.startswith(f"http://127.0.0.1:{api.ports.envoy}/media-objects/"), image_ref
    assert "signature=" in image_ref
    [output] = done["outputs"]
    picture = pictures.decode((await http.get(output["url"])).content)
    assert pictures.mean_difference(picture, styled(job.photo)) < 2


async def test_a_worker_without_the_key_of_an_enabled_vendor_refuses_to_start(
    api_of_its_own: Stack,
) -> None:
    async with hosted_alone(api_of_its_own, REPLICATE) as hosted:
        # fal's model on too, while this worker has only Replicate's key.
        await enable_models(api_of_its_own.database_url, FAL.model_id)
        worker = hosted.start_worker("replicate-only")
        code = await exited(worker, within=30)
        assert worker.child.log_path is not None
        log = worker.child.log_path.read_text(errors="replace")
        fake = hosted.fake
    assert code != 0
    assert "ATELIER_FAL_KEY" in log and FAL.model_id in log
    assert REPLICATE.key not in log
    assert fake.requests == []
