"""A user's job history through the whole stack: ListJobs filtered by statuses and
creation time (JSON through Envoy), DeleteJob with and without the job's photos (gone from
media's storage), its refusals, the deleted job leaving the watch streams, and media
stopped for real while a delete needs it.

The API runs alone on a database of its own (this module stops media, and claims jobs
from a queue no other test shares); the test plays the worker with creation's own store
(claim, complete), so each job is in exactly the state the test needs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.media.v1 import asset_pb2
from atelier.notify.v1 import notify_service_pb2, notify_service_pb2_grpc
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.tables import jobs, points_ledger
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.fenced import claim_this, fenced_write
from tests.support.rpc import bearer

ACTIVE = [("statuses", "JOB_STATUS_QUEUED"), ("statuses", "JOB_STATUS_RUNNING")]
KEEP_ASSETS = {"keepAssets": "true"}


# The module's own stack stands in for the session's under the usual names.
@pytest.fixture(scope="module")
def stack(api_of_its_own: Stack) -> Stack:
    return api_of_its_own


@pytest.fixture(scope="module")
def edge_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.ports.envoy}"


@pytest.fixture
async def engine(stack: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(stack.database_url))
    yield engine
    await engine.dispose()


async def submit(http: httpx.AsyncClient, edge_url: str, user: User, asset: str) -> dict[str, Any]:
    made = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert made.status_code == 200, made.text
    job: dict[str, Any] = made.json()["job"]
    return job


async def cancel(http: httpx.AsyncClient, edge_url: str, user: User, job: dict[str, Any]) -> None:
    cancelled = await http.post(
        f"{edge_url}/v1/jobs/{job['jobId']}:cancel", headers=user.headers, json={}
    )
    assert cancelled.json()["job"]["status"] == "JOB_STATUS_CANCELLED"


async def claim(engine: AsyncEngine, job_id: str) -> int:
    """Plays a worker that takes this very job (the module's other tests leave queued
    jobs); its lease epoch."""
    now = datetime.now(UTC)
    claimed = await claim_this(engine, "history-worker", job_id, timedelta(seconds=60), now)
    return claimed.lease_epoch


async def succeed(stack: Stack, engine: AsyncEngine, user: User, job_id: str) -> str:
    """Runs the job to SUCCEEDED with a real output stored by media; the output's id."""
    epoch = await claim(engine, job_id)
    output = await put_input(stack, user.user_id, asset_pb2.ASSET_PURPOSE_AI_OUTPUT)
    assert await fenced_write(
        engine, FencedWrite.COMPLETE, job_id, epoch, datetime.now(UTC), outputs_value([output])
    )
    return output


def stored(stack: Stack, asset_id: str) -> bool:
    """Whether media's local storage still holds the asset's object."""
    return any((stack.work_dir / "media").rglob(asset_id))


def reason(response: httpx.Response) -> str:
    return str(response.json()["details"][0]["reason"])


def details(response: httpx.Response) -> dict[str, Any]:
    return {d["@type"].rsplit(".", 1)[-1]: d for d in response.json()["details"]}


def violations(response: httpx.Response) -> list[str]:
    return [v["field"] for v in details(response)["BadRequest"]["fieldViolations"]]


def retry_delay(response: httpx.Response) -> float:
    return float(details(response)["RetryInfo"]["retryDelay"].removesuffix("s"))


async def test_lists_filter_by_statuses_and_creation_time(
    stack: Stack, engine: AsyncEngine, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    cancelled = await submit(http, edge_url, user, asset)
    await cancel(http, edge_url, user, cancelled)
    running, succeeded, queued = [await submit(http, edge_url, user, asset) for _ in range(3)]
    await succeed(stack, engine, user, succeeded["jobId"])
    await claim(engine, running["jobId"])

    async def listed(*params: tuple[str, str]) -> httpx.Response:
        return await http.get(f"{edge_url}/v1/jobs", headers=user.headers, params=list(params))

    active = (await listed(*ACTIVE)).json()
    assert [j["jobId"] for j in active["jobs"]] == [queued["jobId"], running["jobId"]]
    assert [j["status"] for j in active["jobs"]] == ["JOB_STATUS_QUEUED", "JOB_STATUS_RUNNING"]

    # [running's creation, queued's creation): half open.
    window = [
        ("createTimeAfter", running["createTime"]),
        ("createTimeBefore", queued["createTime"]),
    ]
    in_window = (await listed(*window)).json()
    assert [j["jobId"] for j in in_window["jobs"]] == [succeeded["jobId"], running["jobId"]]
    finished = (await listed(("statuses", "JOB_STATUS_SUCCEEDED"), window[0])).json()
    assert [j["jobId"] for j in finished["jobs"]] == [succeeded["jobId"]]

    # A page token works only with the filter it was issued for.
    first = (await listed(*ACTIVE, ("pageSize", "1"))).json()
    token = ("pageToken", first["nextPageToken"])
    second = (await listed(*ACTIVE, ("pageSize", "1"), token)).json()
    assert [j["jobId"] for j in first["jobs"] + second["jobs"]] == [
        queued["jobId"],
        running["jobId"],
    ]
    assert second["nextPageToken"] == ""
    for other in ([ACTIVE[0]], [*ACTIVE, window[0]], []):
        refused = await listed(*other, token)
        assert refused.status_code == 400
        assert reason(refused) == "INVALID_PAGE_TOKEN"
        assert violations(refused) == ["page_token"]

    inverted = await listed(
        ("createTimeAfter", queued["createTime"]), ("createTimeBefore", running["createTime"])
    )
    assert inverted.status_code == 400
    assert reason(inverted) == "INVALID_JOB_FILTER"
    assert violations(inverted) == ["create_time_before"]
    unspecified = await listed(("statuses", "JOB_STATUS_UNSPECIFIED"))
    assert unspecified.status_code == 400
    assert violations(unspecified) == ["statuses[0]"]


async def test_delete_a_finished_job_keeps_a_tombstone_and_deletes_photos_unless_kept(
    stack: Stack, engine: AsyncEngine, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    photo, shared_photo = [await put_input(stack, user.user_id) for _ in range(2)]
    kept = await submit(http, edge_url, user, photo)
    kept_output = await succeed(stack, engine, user, kept["jobId"])
    balance = (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json()

    deleted = await http.delete(
        f"{edge_url}/v1/jobs/{kept['jobId']}", headers=user.headers, params=KEEP_ASSETS
    )
    assert (deleted.status_code, deleted.json()) == (200, {})
    gone = await http.get(f"{edge_url}/v1/jobs/{kept['jobId']}", headers=user.headers)
    assert (gone.status_code, reason(gone)) == (404, "JOB_NOT_FOUND")
    listed = (await http.get(f"{edge_url}/v1/jobs", headers=user.headers)).json()
    assert listed["jobs"] == []
    assert stored(stack, kept_output) and stored(stack, photo)
    # The points stay spent: the ledger keeps the job's entries, the row its tombstone.
    assert (await http.get(f"{edge_url}/v1/balance", headers=user.headers)).json() == balance
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                select(jobs.c.prompt, jobs.c.parameters, jobs.c.deleted_at, jobs.c.status).where(
                    jobs.c.job_id == kept["jobId"]
                )
            )
        ).one()
        entries = (
            await connection.execute(
                select(func.count()).where(points_ledger.c.job_id == kept["jobId"])
            )
        ).scalar_one()
    assert (row.prompt, row.parameters, row.status) == ("", {}, "succeeded")
    assert row.deleted_at is not None and entries == 2  # reserve, capture

    # Again, by default: the replay succeeds and deletes the photos the first one kept.
    again = await http.delete(f"{edge_url}/v1/jobs/{kept['jobId']}", headers=user.headers)
    assert again.status_code == 200
    assert not stored(stack, kept_output) and not stored(stack, photo)

    # Two jobs made from one photo: the photo goes with the last of them.
    first, second = [await submit(http, edge_url, user, shared_photo) for _ in range(2)]
    first_output = await succeed(stack, engine, user, first["jobId"])
    await cancel(http, edge_url, user, second)
    for job, photo_left in ((first, True), (second, False)):
        response = await http.delete(
            f"{edge_url}/v1/jobs/{job['jobId']}",
            headers=user.headers,
        )
        assert response.status_code == 200, response.text
        assert stored(stack, shared_photo) is photo_left
    assert not stored(stack, first_output)


async def test_only_the_owners_finished_jobs_can_be_deleted(
    stack: Stack, engine: AsyncEngine, edge_url: str, http: httpx.AsyncClient
) -> None:
    owner, stranger = User(), User()
    asset = await put_input(stack, owner.user_id)
    running, queued = [await submit(http, edge_url, owner, asset) for _ in range(2)]
    await claim(engine, running["jobId"])
    for job, status in ((running, "running"), (queued, "queued")):
        refused = await http.delete(f"{edge_url}/v1/jobs/{job['jobId']}", headers=owner.headers)
        assert refused.status_code == 400
        info = refused.json()["details"][0]
        assert (info["reason"], info["metadata"]["status"]) == ("JOB_NOT_FINISHED", status)
    await cancel(http, edge_url, owner, queued)
    for headers, job_id in (
        (stranger.headers, queued["jobId"]),  # finished, but someone else's
        (owner.headers, str(uuid.uuid4())),
    ):
        missing = await http.delete(f"{edge_url}/v1/jobs/{job_id}", headers=headers)
        assert (missing.status_code, reason(missing)) == (404, "JOB_NOT_FOUND")
    malformed = await http.delete(f"{edge_url}/v1/jobs/not-a-job", headers=owner.headers)
    assert (malformed.status_code, reason(malformed)) == (400, "INVALID_JOB_ID")
    # Nothing was touched: both jobs are still there, the photo too.
    for job, status in ((running, "JOB_STATUS_RUNNING"), (queued, "JOB_STATUS_CANCELLED")):
        read = await http.get(f"{edge_url}/v1/jobs/{job['jobId']}", headers=owner.headers)
        assert read.json()["job"]["status"] == status
    assert stored(stack, asset)


async def test_a_deleted_job_leaves_the_watch_streams(
    stack: Stack, engine: AsyncEngine, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    metadata = bearer(user.token)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.public['notify']}") as channel:
        notify = notify_service_pb2_grpc.NotifyServiceStub(channel)

        async def snapshot(cursor: str = "") -> list[notify_service_pb2.WatchJobsResponse]:
            call = notify.WatchJobs(
                notify_service_pb2.WatchJobsRequest(cursor=cursor), metadata=metadata
            )
            messages = []
            async for message in call:
                messages.append(message)
                if message.HasField("snapshot_end"):
                    break
            call.cancel()
            return messages

        live = notify.WatchJobs(notify_service_pb2.WatchJobsRequest(), metadata=metadata)
        async for message in live:
            if message.HasField("snapshot_end"):
                start = message.cursor
                break
        job = await submit(http, edge_url, user, asset)
        await succeed(stack, engine, user, job["jobId"])
        url = f"{edge_url}/v1/jobs/{job['jobId']}"
        last = int((await http.get(url, headers=user.headers)).json()["job"]["version"])
        deleted = await http.delete(url, headers=user.headers)
        assert deleted.status_code == 200

        # Open streams hear of it as one more version, after the job's last state.
        seen = []
        async with asyncio.timeout(15):
            async for message in live:
                if message.HasField("job"):
                    seen.append(message.job)
                    if message.job.deleted:
                        break
        live.cancel()
        tombstone = seen[-1]
        assert tombstone.version == last + 1
        assert (tombstone.done, len(tombstone.outputs), tombstone.HasField("error")) == (
            True,
            0,
            False,
        )
        assert all(not s.deleted and s.version <= last for s in seen[:-1])

        # A stream resuming from before sees the tombstone only; a fresh one, nothing.
        resumed = [m.job for m in await snapshot(start) if m.HasField("job")]
        assert [(s.job_id, s.deleted, len(s.outputs)) for s in resumed] == [(job["jobId"], True, 0)]
        assert [m for m in await snapshot() if m.HasField("job")] == []
        watch = notify.WatchJob(
            notify_service_pb2.WatchJobRequest(job_id=job["jobId"]), metadata=metadata
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in watch:
                pass
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_media_down_is_unavailable_and_a_retry_after_its_restart_finishes(
    stack: Stack, engine: AsyncEngine, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    photo = await put_input(stack, user.user_id)
    job = await submit(http, edge_url, user, photo)
    output = await succeed(stack, engine, user, job["jobId"])
    url = f"{edge_url}/v1/jobs/{job['jobId']}"

    stack.stop_service("media")
    try:
        refused = await http.delete(url, headers=user.headers)
        assert refused.status_code == 503
        assert reason(refused) == "MEDIA_UNAVAILABLE"
        assert retry_delay(refused) > 0
        # Nothing is half done: the job is whole, and so are its photos.
        read = await http.get(url, headers=user.headers)
        assert read.json()["job"]["status"] == "JOB_STATUS_SUCCEEDED"
        assert stored(stack, output) and stored(stack, photo)
    finally:
        stack.start_service("media")

    # A client honouring RetryInfo: creation's channel to media reconnects within ~2 s.
    deadline = time.monotonic() + 10
    while True:
        response = await http.delete(url, headers=user.headers)
        if response.status_code != 503:
            break
        assert time.monotonic() < deadline, "media never came back for creation"
        await asyncio.sleep(retry_delay(response))
    assert response.status_code == 200, response.text
    assert not stored(stack, output) and not stored(stack, photo)
    gone = await http.get(url, headers=user.headers)
    assert gone.status_code == 404
