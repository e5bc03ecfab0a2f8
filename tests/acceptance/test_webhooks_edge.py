"""A webhook as an app's backend meets it: an operator registers an endpoint over
AdminService, a user's job runs through the edge to SUCCEEDED, and the backend's receiver
(verifying every delivery with the reference `standardwebhooks` package) gets queued,
running and succeeded, each body's job the one the API returns, its output's signed URL
downloadable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc, webhook_pb2
from services.dev.stack import Stack
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.rpc import bearer
from tests.support.stacks import job_in, stack_of_its_own
from tests.support.webhook_receiver import WebhookReceiver

EVENTS = ["job.queued", "job.running", "job.succeeded"]
SIGNED = {"url", "urlExpireTime", "thumbnailUrl", "thumbnailUrlExpireTime"}


@pytest.fixture(scope="module")
def engine_stack(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with stack_of_its_own(postgres_admin_url, tmp_path_factory.mktemp("hooks"), "all", {}) as s:
        yield s


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    running = WebhookReceiver([])
    yield running
    running.stop()


def without_urls(job: dict[str, Any]) -> dict[str, Any]:
    """The job with its outputs' URL fields left out: a URL is signed for a window, and a
    read in another window than the delivery's is signed again."""
    outputs = [{k: v for k, v in o.items() if k not in SIGNED} for o in job.get("outputs", [])]
    return {**job, "outputs": outputs}


async def test_a_backend_hears_a_job_run_through_the_edge_as_the_api_tells_it(
    engine_stack: Stack, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    stack = engine_stack
    user = User()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['creation']}") as ch:
        admin = admin_service_pb2_grpc.AdminServiceStub(ch)
        created = await admin.CreateWebhookEndpoint(
            admin_service_pb2.CreateWebhookEndpointRequest(
                endpoint=webhook_pb2.WebhookEndpoint(
                    url=receiver.url, event_types=EVENTS, user_ids=[user.user_id]
                )
            ),
            metadata=bearer(DEV_SERVICE_TOKEN),
        )
    receiver.secrets.append(created.secret)

    url = f"http://127.0.0.1:{stack.ports.envoy}"
    headers = {**user.headers, "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        asset = await put_input(stack, user.user_id)
        submitted = await http.post(f"{url}/v1/jobs", headers=headers, json=job_body(asset))
        assert submitted.status_code == 200, submitted.text
        job_id = submitted.json()["job"]["jobId"]
        final = await job_in(http, url, user.headers, job_id, {"JOB_STATUS_SUCCEEDED"}, 60)

        await receiver.wait_until(
            lambda r: {a.body["type"] for a in r.accepted()} >= set(EVENTS), 60
        )
        assert receiver.unverified == []
        by_type = {a.body["type"]: a for a in receiver.accepted() if a.job_id == job_id}
        assert set(by_type) == set(EVENTS)
        # Each event is one change; its data is the job when it was fanned out, at that
        # change or later (docs/webhooks.md), never past the final state; the receiver
        # keeps the highest version.
        versions = {t: a.version for t, a in by_type.items()}
        assert max(versions.values()) == versions["job.succeeded"] == int(final["version"])
        statuses = {t: a.body["data"]["status"] for t, a in by_type.items()}
        later = ["JOB_STATUS_QUEUED", "JOB_STATUS_RUNNING", "JOB_STATUS_SUCCEEDED"]
        assert statuses["job.queued"] in later
        assert statuses["job.running"] in later[1:]

        succeeded = by_type["job.succeeded"].body["data"]
        # The terminal job as the API returns it, field for field (the same JSON names,
        # enums by name, defaults printed).
        assert without_urls(succeeded) == without_urls(final)
        [output] = succeeded["outputs"]
        downloaded = await http.get(output["url"])
        assert downloaded.status_code == 200
        assert downloaded.headers["content-type"].startswith("image/")
        assert len(downloaded.content) == int(output["sizeBytes"])
