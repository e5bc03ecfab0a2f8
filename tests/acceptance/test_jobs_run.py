"""Jobs run: the whole stack with creation's job engine and the stub provider, driven as
the app drives it — JSON through Envoy — from submit to a downloadable picture, and a
cancel that reaches a running job."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from PIL import Image, ImageChops, ImageOps

from atelier.creation.v1 import (
    creation_service_pb2,
    creation_service_pb2_grpc,
    error_reason_pb2,
    job_pb2,
)
from atelier.notify.v1 import notify_service_pb2, notify_service_pb2_grpc
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.pictures import encode, scene
from tests.support.rpc import bad_request, bearer, error_info
from tests.support.stacks import job_in, job_with_thumbnails, stack_of_its_own

HEARTBEAT_SECONDS = 1.0
STUB_MAX_PIXELS = 1_000_000


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own (its own database: its worker must not take other tests' jobs)."""
    work = tmp_path_factory.mktemp("running")
    engine_env = {
        # Long enough to cancel a running job, short enough to wait for one.
        "ATELIER_STUB_DURATION": "6",
        "ATELIER_HEARTBEAT": str(HEARTBEAT_SECONDS),
        "ATELIER_LEASE_TTL": "5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        # The stub takes photos up to 1 MP (media takes larger): a larger one is the
        # provider refusing the input.
        "ATELIER_STUB_MAX_INPUT_PIXELS": str(STUB_MAX_PIXELS),
    }
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


async def job_when(
    http: httpx.AsyncClient, url: str, user: User, job_id: str, status: str, within: float
) -> dict[str, Any]:
    return await job_in(http, url, user.headers, job_id, {status}, within)


async def test_a_submitted_job_runs_to_a_picture_that_downloads(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    photo = encode(scene(800, 600))
    asset = await put_input(running, user.user_id, data=photo)
    body = job_body(asset, width=512, height=512)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=body)
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]

    await job_when(http, url, user, job_id, "JOB_STATUS_RUNNING", within=15)
    done = await job_when(http, url, user, job_id, "JOB_STATUS_SUCCEEDED", within=30)
    assert done["progressPercent"] == 100 and done["attempt"] == 1

    assert done["numOutputs"] == 1 and len(done["outputs"]) == 1
    download = await http.get(done["outputs"][0]["url"])
    assert download.status_code == 200
    picture = Image.open(io.BytesIO(download.content)).convert("RGB")
    # The size asked for, not the photo's 800x600: scaled and cropped around the centre.
    assert picture.size == (512, 512)
    centre = ImageOps.fit(Image.open(io.BytesIO(photo)).convert("RGB"), (512, 512))
    assert ImageChops.difference(picture, centre).getbbox() is not None  # and styled
    # The output reports its size, on the job and on media's asset, read through the edge.
    assert (done["outputs"][0]["width"], done["outputs"][0]["height"]) == (512, 512)
    output_id = done["outputs"][0]["assetId"]
    stored = await http.get(f"{url}/v1/assets/{output_id}", headers=user.headers)
    assert stored.status_code == 200, stored.text
    assert (stored.json()["asset"]["width"], stored.json()["asset"]["height"]) == (512, 512)
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (95, 0)  # captured
    await outputs_a_client_can_cache_and_lay_out(http, url, user, job_id, download.content)


async def outputs_a_client_can_cache_and_lay_out(
    http: httpx.AsyncClient, url: str, user: User, job_id: str, picture: bytes
) -> None:
    """Reads of a job within one URL window (3600 s) hand out the same output URLs, so an
    image cache keyed by URL hits; the output says its type, length and size; the picture
    and its thumbnail download with Cache-Control."""

    async def outputs() -> list[dict[str, Any]]:
        got = await http.get(f"{url}/v1/jobs/{job_id}", headers=user.headers)
        assert got.status_code == 200, got.text
        found: list[dict[str, Any]] = got.json()["job"]["outputs"]
        return found

    # The thumbnail follows the job (media makes it in the background): read once it
    # is there, so both reads see the same outputs.
    await job_with_thumbnails(http, url, user.headers, job_id)
    read_at = datetime.now(UTC)
    first, second = await outputs(), await outputs()
    if first[0]["urlExpireTime"] != second[0]["urlExpireTime"]:
        # The two reads straddled a window's end (once an hour): the next one does not.
        read_at = datetime.now(UTC)
        first, second = second, await outputs()
    assert second == first
    listed = await http.get(f"{url}/v1/jobs?pageSize=10", headers=user.headers)
    (job,) = [j for j in listed.json()["jobs"] if j["jobId"] == job_id]
    assert job["outputs"] == first

    (output,) = first
    assert (output["contentType"], output["sizeBytes"]) == ("image/png", len(picture))
    assert (output["width"], output["height"]) == (512, 512)
    expires = datetime.fromisoformat(output["urlExpireTime"].replace("Z", "+00:00"))
    assert expires.timestamp() % 3600 == 300  # a window's end (epoch-aligned) plus the TTL
    assert expires - read_at >= timedelta(seconds=300)  # at least the TTL after the read
    for link, content_type in (
        (output["url"], "image/png"),
        (output["thumbnailUrl"], "image/webp"),
    ):
        download = await http.get(link)
        assert download.status_code == 200, download.text
        assert download.headers["content-type"] == content_type
        assert download.headers["cache-control"] == "private, max-age=3900, immutable"
        if link == output["url"]:
            assert download.content == picture
            assert len(download.content) == output["sizeBytes"]


async def test_cancelling_a_running_job_takes_one_beat(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    job_id = submitted.json()["job"]["jobId"]
    await job_when(http, url, user, job_id, "JOB_STATUS_RUNNING", within=15)

    asked = time.monotonic()
    cancel = await http.post(f"{url}/v1/jobs/{job_id}:cancel", headers=user.headers, json={})
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["job"]["cancelRequested"] is True
    cancelled = await job_when(http, url, user, job_id, "JOB_STATUS_CANCELLED", within=10)
    # Seen on the next beat, then the provider is told and the job acknowledged.
    assert time.monotonic() - asked <= HEARTBEAT_SECONDS + 2.0
    assert not cancelled.get("outputs")
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (100, 0)  # released


async def test_a_job_of_several_outputs_reserves_each_and_makes_each_through_the_edge(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    body = job_body(asset, numOutputs=3)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=body)
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["job"]
    assert (job["numOutputs"], job["pricePoints"]) == (3, 15)  # the model's 5, three times
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (85, 15)

    done = await job_when(http, url, user, job["jobId"], "JOB_STATUS_SUCCEEDED", within=30)
    assert len(done["outputs"]) == 3
    assert len({o["assetId"] for o in done["outputs"]}) == 3
    pictures = []
    for output in done["outputs"]:
        assert output["urlExpireTime"]
        download = await http.get(output["url"])
        assert download.status_code == 200
        pictures.append(download.content)
    assert len(set(pictures)) == 3  # three different images
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (85, 0)  # captured

    # The same key with another count is another request.
    keyed = {**user.headers, "idempotency-key": "several-1"}
    first = await http.post(f"{url}/v1/jobs", headers=keyed, json=job_body(asset, numOutputs=2))
    assert first.status_code == 200, first.text
    other = await http.post(f"{url}/v1/jobs", headers=keyed, json=job_body(asset, numOutputs=1))
    assert other.status_code == 409
    assert other.json()["details"][0]["reason"] == "IDEMPOTENCY_KEY_REUSED"


async def test_num_outputs_over_grpc(running: Stack, http: httpx.AsyncClient) -> None:
    """Native gRPC through the edge's listener: two outputs reserved and made, five
    refused with a field violation naming num_outputs."""
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    request = creation_service_pb2.SubmitJobRequest(
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id=asset,
        width=512,
        height=512,
        num_outputs=2,
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.envoy}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        reply = await stub.SubmitJob(request, metadata=bearer(user.token))
        assert (reply.job.num_outputs, reply.job.price_points) == (2, 10)

        request.num_outputs = 5
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(request, metadata=bearer(user.token))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "INVALID_JOB_REQUEST"
        violations = bad_request(caught.value)
        assert violations is not None
        assert [v.field for v in violations.field_violations] == ["num_outputs"]

        await job_when(http, url, user, reply.job.job_id, "JOB_STATUS_SUCCEEDED", within=30)
        got = await stub.GetJob(
            creation_service_pb2.GetJobRequest(job_id=reply.job.job_id),
            metadata=bearer(user.token),
        )
    assert len(got.job.outputs) == 2
    for output in got.job.outputs:
        assert (await http.get(output.url)).status_code == 200


def over_the_stub_limit() -> bytes:
    """A real photo media accepts with more pixels than the stub takes (1200x1000)."""
    return encode(scene(1200, 1000))


async def test_a_photo_the_provider_refuses_fails_with_a_typed_reason_through_the_edge(
    running: Stack, http: httpx.AsyncClient
) -> None:
    """JSON through Envoy: the job fails PROVIDER_REJECTED_INPUT, not worth submitting
    again (retryable false, left out of the JSON as a default), after one attempt; the
    internal code is nowhere; the points go back."""
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id, data=over_the_stub_limit())
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]

    failed = await job_when(http, url, user, job_id, "JOB_STATUS_FAILED", within=30)
    error = failed["error"]
    assert error["reason"] == "JOB_ERROR_REASON_PROVIDER_REJECTED_INPUT"
    assert error.get("retryable", False) is False
    assert str(STUB_MAX_PIXELS) in error["message"]
    assert set(error) <= {"reason", "retryable", "message"}  # no internal code
    assert failed["attempt"] == 1  # terminal at once: a new attempt would fail alike
    listed = await http.get(f"{url}/v1/jobs", headers=user.headers)
    assert listed.json()["jobs"][0]["error"] == error
    # The watch stream carries the same typed error (the outbox payload, through notify).
    async with http.stream(
        "GET", f"{url}/v1/jobs/{job_id}:watch", headers=user.headers, timeout=30
    ) as response:
        assert response.status_code == 200
        states = [
            message["job"]
            async for line in response.aiter_lines()
            if line.strip() and "job" in (message := json.loads(line))
        ]
    assert states[-1]["status"] == "JOB_STATUS_FAILED"
    assert states[-1]["error"] == error
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == (100, 0)  # released


async def test_a_photo_the_provider_refuses_fails_with_a_typed_reason_over_grpc(
    running: Stack, http: httpx.AsyncClient
) -> None:
    """Native gRPC through the edge's listener: GetJob, and notify's WatchJob, say
    PROVIDER_REJECTED_INPUT with retryable false."""
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id, data=over_the_stub_limit())
    request = creation_service_pb2.SubmitJobRequest(
        model_id="stub-fast", style_id="watercolor", input_asset_id=asset, width=512, height=512
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.envoy}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        reply = await stub.SubmitJob(request, metadata=bearer(user.token))
        job_id = reply.job.job_id
        await job_when(http, url, user, job_id, "JOB_STATUS_FAILED", within=30)
        got = await stub.GetJob(
            creation_service_pb2.GetJobRequest(job_id=job_id), metadata=bearer(user.token)
        )
        assert got.job.status == job_pb2.JOB_STATUS_FAILED
        assert got.job.HasField("error")
        assert got.job.error.reason == error_reason_pb2.JOB_ERROR_REASON_PROVIDER_REJECTED_INPUT
        assert got.job.error.retryable is False
        assert got.job.error.message

        notify = notify_service_pb2_grpc.NotifyServiceStub(channel)
        last = None
        async for message in notify.WatchJob(
            notify_service_pb2.WatchJobRequest(job_id=job_id),
            metadata=bearer(user.token),
            timeout=30,
        ):
            if message.HasField("job"):
                last = message.job
        assert last is not None and last.status == job_pb2.JOB_STATUS_FAILED
        assert last.error == got.job.error
