"""Jobs run: the whole stack with creation's job engine and the stub provider, driven as
the app drives it — JSON through Envoy — from submit to a downloadable picture, and a
cancel that reaches a running job."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image, ImageChops

from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, png, put_input
from tests.support.stacks import job_in, stack_of_its_own

HEARTBEAT_SECONDS = 1.0


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
    photo = png()
    asset = await put_input(running, user.user_id, data=photo)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]

    await job_when(http, url, user, job_id, "JOB_STATUS_RUNNING", within=15)
    done = await job_when(http, url, user, job_id, "JOB_STATUS_SUCCEEDED", within=30)
    assert done["progressPercent"] == 100 and done["attempt"] == 1

    download = await http.get(done["outputUrl"])
    assert download.status_code == 200
    picture = Image.open(io.BytesIO(download.content)).convert("RGB")
    original = Image.open(io.BytesIO(photo)).convert("RGB")
    assert picture.size == original.size  # the stub keeps size and orientation
    assert ImageChops.difference(picture, original).getbbox() is not None  # and styles it
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == ("95", "0")  # captured


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
    assert not cancelled.get("outputUrl") and not cancelled.get("outputAssetId")
    balance = (await http.get(f"{url}/v1/balance", headers=user.headers)).json()
    assert (balance["availablePoints"], balance["reservedPoints"]) == ("100", "0")  # released
