"""A phone's history grid in one call, over the whole stack through the edge: a succeeded
job's stream state carries the output's url, and its ListJobs entry the url and, once
media has made the preview (in the background, after the job succeeded), the
thumbnail_url, each downloading an image, the thumbnail a small WebP; with media
stopped for real the list still answers at once (URLs empty), with media frozen
(SIGSTOP) within creation's deadline on it, and the URLs come back with media."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.media import noisy_png
from tests.support.stacks import job_with_thumbnails, stack_of_its_own

# creation's deadline on media is 2 s; a stopped media refuses at once.
ANSWER_WITHOUT_MEDIA = 3.0
# A frozen media answers nothing: the list waits out that deadline, never more.
ANSWER_WITH_MEDIA_FROZEN = 2.0 + 2.0


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("grid")
    engine_env = {
        "ATELIER_STUB_DURATION": "0.3",
        "ATELIER_WORKER_PROVIDER_POLL": "0.1",
        # Stopping media waits for nothing in flight.
        "ATELIER_DRAIN_GRACE": "0",
    }
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


async def watched_to_the_end(
    http: httpx.AsyncClient, url: str, user: User, job_id: str
) -> dict[str, Any]:
    """The last state WatchJob streams (newline-delimited JSON); the stream ends after it."""
    states = []
    async with http.stream(
        "GET", f"{url}/v1/jobs/{job_id}:watch", headers=user.headers, timeout=30
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.strip() and "job" in (message := json.loads(line)):
                states.append(message["job"])
    assert states[-1]["status"] == "JOB_STATUS_SUCCEEDED"
    return states[-1]


async def list_jobs(http: httpx.AsyncClient, url: str, user: User) -> list[dict[str, Any]]:
    listed = await http.get(f"{url}/v1/jobs", headers=user.headers, params={"pageSize": 10})
    assert listed.status_code == 200, listed.text
    jobs: list[dict[str, Any]] = listed.json()["jobs"]
    return jobs


async def image_at(http: httpx.AsyncClient, link: str) -> tuple[Image.Image, int]:
    download = await http.get(link)
    assert download.status_code == 200
    image = Image.open(io.BytesIO(download.content))
    image.load()
    return image, len(download.content)


async def test_a_history_grid_is_one_call_with_pictures_and_thumbnails(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id, data=noisy_png(640, 480))
    body = job_body(asset, width=640, height=480)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=body)
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]

    # The stream's terminal state carries the picture's URL; its thumbnail's only if
    # media had made it by then (media makes it after the job succeeded).
    [streamed] = (await watched_to_the_end(http, url, user, job_id))["outputs"]
    assert streamed["url"] and streamed["urlExpireTime"]
    await job_with_thumbnails(http, url, user.headers, job_id)

    # Once it exists, the list carries both: the grid needs no call per job.
    [job] = await list_jobs(http, url, user)
    assert job["jobId"] == job_id and job["status"] == "JOB_STATUS_SUCCEEDED"
    [output] = job["outputs"]
    assert output["assetId"] == streamed["assetId"]
    assert output["urlExpireTime"] and output["thumbnailUrlExpireTime"]
    picture, picture_bytes = await image_at(http, output["url"])
    thumbnail, thumbnail_bytes = await image_at(http, output["thumbnailUrl"])
    assert picture.size == (640, 480)
    assert (thumbnail.format, thumbnail.size) == ("WEBP", (256, 192))
    assert thumbnail_bytes < picture_bytes // 10
    if streamed.get("thumbnailUrl"):
        _, streamed_bytes = await image_at(http, streamed["thumbnailUrl"])
        assert streamed_bytes == thumbnail_bytes
    # Laid out before downloading: the output says what the picture is.
    assert (output["width"], output["height"]) == (640, 480)
    assert (output["contentType"], output["sizeBytes"]) == ("image/png", picture_bytes)
    # The stream and the list hand out the same URLs within a window (3600 s), so the
    # grid's image cache hits for a picture first seen on the stream.
    if streamed["urlExpireTime"] == output["urlExpireTime"]:  # not across a window's end
        if streamed.get("thumbnailUrl"):
            assert streamed == output
        else:  # sent before media had made the preview: the rest is the same
            preview = ("thumbnailUrl", "thumbnailUrlExpireTime")
            assert {k: v for k, v in streamed.items() if k not in preview} == {
                k: v for k, v in output.items() if k not in preview
            }


async def a_succeeded_job(running: Stack, http: httpx.AsyncClient) -> tuple[User, str]:
    """A new user's job, run to SUCCEEDED (watched through the edge): (user, job id)."""
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    job_id: str = submitted.json()["job"]["jobId"]
    await watched_to_the_end(http, url, user, job_id)
    await job_with_thumbnails(http, url, user.headers, job_id)
    return user, job_id


async def test_without_media_the_list_still_answers_and_the_urls_come_back_with_it(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user, job_id = await a_succeeded_job(running, http)

    running.stop_service("media")
    try:
        asked = time.monotonic()
        [job] = await list_jobs(http, url, user)
        assert time.monotonic() - asked < ANSWER_WITHOUT_MEDIA
        assert job["status"] == "JOB_STATUS_SUCCEEDED"
        [output] = job["outputs"]
        # The job and its asset id, without links: a placeholder, not an error screen.
        assert output["assetId"] and not output.get("url") and not output.get("thumbnailUrl")
        got = await http.get(f"{url}/v1/jobs/{job_id}", headers=user.headers)
        assert got.status_code == 200 and not got.json()["job"]["outputs"][0].get("url")
    finally:
        running.start_service("media")

    # creation's channel reconnects within about two seconds of media's return.
    deadline = time.monotonic() + 10
    while not (await list_jobs(http, url, user))[0]["outputs"][0].get("thumbnailUrl"):
        assert time.monotonic() < deadline, "the URLs did not come back with media"
        await asyncio.sleep(0.2)


async def test_with_media_frozen_the_list_answers_within_its_deadline_and_urls_return_on_thaw(
    running: Stack, http: httpx.AsyncClient
) -> None:
    """SIGSTOP, as an outside prober freezes a dependency: the connection stays open and
    nothing answers, so only creation's deadline on GetAssetUrls bounds the wait."""
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user, job_id = await a_succeeded_job(running, http)

    media = running.child("media").process
    media.send_signal(signal.SIGSTOP)
    try:
        for _ in range(2):  # the second call finds the channel as the first left it
            asked = time.monotonic()
            [job] = await list_jobs(http, url, user)
            assert time.monotonic() - asked < ANSWER_WITH_MEDIA_FROZEN
            assert job["status"] == "JOB_STATUS_SUCCEEDED"
            [output] = job["outputs"]
            assert output["assetId"] and not output.get("url") and not output.get("thumbnailUrl")
        asked = time.monotonic()
        got = await http.get(f"{url}/v1/jobs/{job_id}", headers=user.headers)
        assert time.monotonic() - asked < ANSWER_WITH_MEDIA_FROZEN
        assert got.status_code == 200 and not got.json()["job"]["outputs"][0].get("url")
    finally:
        media.send_signal(signal.SIGCONT)

    deadline = time.monotonic() + 10
    while not (await list_jobs(http, url, user))[0]["outputs"][0].get("thumbnailUrl"):
        assert time.monotonic() < deadline, "the URLs did not come back after the thaw"
        await asyncio.sleep(0.2)
