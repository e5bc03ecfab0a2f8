"""A job watched from submit to its end, as a phone does: JSON lines through the edge
with curl, over the whole stack (creation's engine, the outbox relay, notify's projection
and streams)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.stacks import stack_of_its_own


@pytest.fixture(scope="module", params=["", "duplicate_reversed"], ids=["relay", "faulty-relay"])
def running(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory, request: Any
) -> Iterator[Stack]:
    """The whole stack; once with a relay that delivers every batch twice and out of
    order (the streams must still show each version once, in increasing order)."""
    work = tmp_path_factory.mktemp("watched")
    engine_env = {
        "ATELIER_STUB_DURATION": "4",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        # Progress reaches notify with each heartbeat.
        "ATELIER_HEARTBEAT": "0.5",
    }
    if request.param:
        engine_env["ATELIER_RELAY_FAULT"] = request.param
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


async def lines(process: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    assert process.stdout is not None
    out = await asyncio.wait_for(process.stdout.read(), 60)
    await process.wait()
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


async def test_watch_job_with_curl_from_queued_to_succeeded_then_the_stream_closes(
    running: Stack, http: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    asset = await put_input(running, user.user_id)
    submitted = await http.post(f"{url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]
    curl = await asyncio.create_subprocess_exec(
        "curl",
        "-sN",
        "-H",
        f"authorization: {user.headers['authorization']}",
        f"{url}/v1/jobs/{job_id}:watch",
        stdout=asyncio.subprocess.PIPE,
    )
    messages = await lines(curl)
    assert curl.returncode == 0
    states = [m["job"] for m in messages if "job" in m]
    statuses = [s["status"] for s in states]
    assert statuses[0] in {"JOB_STATUS_QUEUED", "JOB_STATUS_RUNNING"}
    assert "JOB_STATUS_RUNNING" in statuses
    assert statuses[-1] == "JOB_STATUS_SUCCEEDED"
    versions = [int(s["version"]) for s in states]
    assert versions == sorted(set(versions))  # each version at most once, increasing
    progress = [s["progressPercent"] for s in states if s["status"] == "JOB_STATUS_RUNNING"]
    assert progress == sorted(progress)
    assert progress[-1] > 0  # rising progress was streamed, not only the end
    # The last state carries what the client needs without a second call: the output's
    # download URL, which serves the picture.
    outputs = states[-1]["outputs"]
    assert len(outputs) == 1 and outputs[0]["assetId"]
    picture = await http.get(outputs[0]["url"])
    assert picture.status_code == 200
    assert Image.open(io.BytesIO(picture.content)).size == (512, 512)  # the size asked
    assert (outputs[0]["width"], outputs[0]["height"]) == (512, 512)  # and says so
