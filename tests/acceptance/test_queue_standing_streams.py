"""A queued job's standing on notify's streams, through the real stack (creation API
alone: jobs stay queued) over gRPC and through Envoy's JSON: a Job message carries the
standing notify holds for its version, and KeepAlive.standings carries it as it moves
(a job ahead cancelled), without a new version. The standing period is the default 5 s:
each wait below is bounded by a few periods, and never a sleep."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.rpc import bearer

# A few standing periods (5 s) and keep-alives (15 s): generous on a loaded machine.
WAIT_SECONDS = 40.0


async def submit(stack: Stack, edge_url: str, http: httpx.AsyncClient, user: User) -> str:
    asset = await put_input(stack, user.user_id)
    answer = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["job"]["jobId"])


async def cancel(edge_url: str, http: httpx.AsyncClient, user: User, job_id: str) -> None:
    answer = await http.post(f"{edge_url}/v1/jobs/{job_id}:cancel", headers=user.headers, json={})
    assert answer.status_code == 200, answer.text


async def until(
    messages: AsyncIterator[pb.WatchJobResponse], wanted: Callable[[pb.WatchJobResponse], bool]
) -> tuple[list[pb.WatchJobResponse], pb.WatchJobResponse]:
    """The messages read before the first ``wanted`` one, and that one."""
    before = []
    async with asyncio.timeout(WAIT_SECONDS):
        async for message in messages:
            if wanted(message):
                return before, message
            before.append(message)
    raise AssertionError(f"the stream ended first: {before}")


def standing_of(job_id: str) -> Callable[[pb.WatchJobResponse], bool]:
    def wanted(message: pb.WatchJobResponse) -> bool:
        return message.HasField("keep_alive") and any(
            s.job_id == job_id for s in message.keep_alive.standings
        )

    return wanted


def only_standing(message: pb.WatchJobResponse) -> pb.JobStanding:
    (standing,) = message.keep_alive.standings
    return standing


async def test_a_watched_queued_job_is_told_its_standing_as_jobs_ahead_leave(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    ahead = await submit(stack, edge_url, http, user)
    watched = await submit(stack, edge_url, http, user)
    address = f"127.0.0.1:{stack.ports.public['notify']}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = notify_service_pb2_grpc.NotifyServiceStub(channel)
        call = stub.WatchJob(pb.WatchJobRequest(job_id=watched), metadata=bearer(user.token))
        stream = call.__aiter__()
        first = await anext(stream)
        assert first.job.status == job_pb2.JOB_STATUS_QUEUED and first.job.version == 1
        # notify asks creation soon after the job is first sent: a KeepAlive tells it.
        before, told = await until(stream, standing_of(watched))
        assert not any(m.HasField("job") for m in before)
        standing = only_standing(told)
        assert standing.version == 1
        assert standing.queue_position >= 1  # its own first job is ahead of it

        # A second stream's first message carries the standing notify holds.
        again = stub.WatchJob(pb.WatchJobRequest(job_id=watched), metadata=bearer(user.token))
        opened = await anext(again.__aiter__())
        assert opened.job.version == 1
        assert 1 <= opened.job.queue_position <= standing.queue_position
        again.cancel()

        # The job ahead leaves the queue: the watched job moves up, with no new version.
        await cancel(edge_url, http, user, ahead)
        before, moved = await until(
            stream,
            lambda m: (
                standing_of(watched)(m)
                and only_standing(m).queue_position < standing.queue_position
            ),
        )
        assert not any(m.HasField("job") for m in before), before
        assert only_standing(moved).version == 1

        await cancel(edge_url, http, user, watched)
        _, last = await until(stream, lambda m: m.HasField("job"))
        assert (last.job.status, last.job.version) == (job_pb2.JOB_STATUS_CANCELLED, 2)
        assert last.job.queue_position == 0 and not last.job.HasField("estimated_start_time")


async def ndjson(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.strip():
            yield json.loads(line)


async def test_watch_jobs_through_the_edge_carries_the_users_standings(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    jobs = [await submit(stack, edge_url, http, user) for _ in range(2)]
    try:
        async with http.stream(
            "GET", f"{edge_url}/v1/jobs:watch", headers=user.headers, timeout=WAIT_SECONDS
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            lines = ndjson(response)
            seen: list[dict[str, Any]] = []
            async with asyncio.timeout(WAIT_SECONDS):
                async for line in lines:
                    seen.append(line)
                    standings = line.get("keepAlive", {}).get("standings", [])
                    if {s["jobId"] for s in standings} == set(jobs):
                        break
            sent = [line["job"] for line in seen if "job" in line]
            assert sorted(j["jobId"] for j in sent) == sorted(jobs)  # each version once
            assert any("snapshotEnd" in line for line in seen)
            # Every KeepAlive prints its standings, empty or not (the schema requires it).
            assert all("standings" in line["keepAlive"] for line in seen if "keepAlive" in line)
            by_id = {s["jobId"]: s for s in standings}
            # The int64 version as a string; the position printed even when 0.
            assert {s["version"] for s in standings} == {"1"}
            first, second = (by_id[j]["queuePosition"] for j in jobs)
            assert second > first >= 0
    finally:
        for job_id in jobs:
            await cancel(edge_url, http, user, job_id)
