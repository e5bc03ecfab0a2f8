"""WaitJob and ``Prefer: wait`` through the real Envoy (JSON) and over gRPC through it: a
client runs a job with SubmitJob and WaitJob alone. The stack's API runs no worker, so a
test plays the worker (claim this very job, complete it with a stored output) or cancels."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import grpc
import httpx
import pytest
from google.protobuf import duration_pb2
from sqlalchemy.ext.asyncio import create_async_engine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc, job_pb2
from atelier.media.v1 import asset_pb2
from services.creation.store.fenced import FencedWrite, outputs_value
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, png, put_input
from tests.support.fenced import claim_this, fenced_write
from tests.support.rpc import bearer, error_info


async def submit(http: httpx.AsyncClient, edge_url: str, user: User, asset: str) -> str:
    made = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert made.status_code == 200, made.text
    return str(made.json()["job"]["jobId"])


async def complete(database_url: str, job_id: str, output: str) -> None:
    """Plays the worker: claims this very job and completes it with ``output``."""
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        now = datetime.now(UTC)
        claimed = await claim_this(engine, "wait-worker", job_id, timedelta(seconds=30), now)
        assert await fenced_write(
            engine, FencedWrite.COMPLETE, job_id, claimed.lease_epoch, now, outputs_value([output])
        )
    finally:
        await engine.dispose()


async def test_wait_job_answers_when_the_job_succeeds_with_its_output(
    stack: Stack, edge_url: str, http: httpx.AsyncClient, database_url: str
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    job_id = await submit(http, edge_url, user, asset)
    picture = png()
    output = await put_input(stack, user.user_id, asset_pb2.ASSET_PURPOSE_AI_OUTPUT, picture)
    waiting = asyncio.ensure_future(
        http.get(f"{edge_url}/v1/jobs/{job_id}:wait?timeout=20s", headers=user.headers)
    )
    await asyncio.sleep(0.5)  # the wait is under way
    assert not waiting.done()
    started = time.monotonic()
    await complete(database_url, job_id, output)
    answer = await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started < 1.5  # woken by the change, not by the time
    assert answer.status_code == 200, answer.text
    job = answer.json()["job"]
    assert (job["jobId"], job["status"]) == (job_id, "JOB_STATUS_SUCCEEDED")
    [linked] = job["outputs"]
    assert linked["assetId"] == output
    download = await http.get(linked["url"])
    assert download.status_code == 200 and download.content == picture


async def test_wait_job_runs_out_with_the_job_as_it_is_past_the_call_deadline(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    job_id = await submit(http, edge_url, user, await put_input(stack, user.user_id))
    started = time.monotonic()
    # 4 s: longer than the service's call deadline (3 s), which a wait does not count.
    answer = await http.get(f"{edge_url}/v1/jobs/{job_id}:wait?timeout=4s", headers=user.headers)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["job"]["status"] == "JOB_STATUS_QUEUED"
    assert 3.9 <= took < 6, took


async def test_wait_job_refuses_another_users_job_and_a_bad_timeout(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    owner, other = User(), User()
    job_id = await submit(http, edge_url, owner, await put_input(stack, owner.user_id))
    started = time.monotonic()
    theirs = await http.get(f"{edge_url}/v1/jobs/{job_id}:wait?timeout=10s", headers=other.headers)
    assert theirs.status_code == 404
    assert theirs.json()["details"][0]["reason"] == "JOB_NOT_FOUND"
    assert time.monotonic() - started < 2
    for bad in ("61s", "-1s"):
        refused = await http.get(
            f"{edge_url}/v1/jobs/{job_id}:wait?timeout={bad}", headers=owner.headers
        )
        assert refused.status_code == 400, (bad, refused.text)
        details = refused.json()["details"]
        assert details[0]["reason"] == "INVALID_WAIT_TIMEOUT"
        violations = [d for d in details if d["@type"].endswith("BadRequest")]
        assert [v["field"] for v in violations[0]["fieldViolations"]] == ["timeout"]
    # Not a duration at all: the edge's own 400 (the transcoder cannot parse it).
    garbled = await http.get(
        f"{edge_url}/v1/jobs/{job_id}:wait?timeout=soon", headers=owner.headers
    )
    assert garbled.status_code == 400


async def test_submit_with_prefer_wait_through_the_edge(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    started = time.monotonic()
    answer = await http.post(
        f"{edge_url}/v1/jobs",
        headers={**user.headers, "prefer": "wait=1", "idempotency-key": "wait-1"},
        json=job_body(asset),
    )
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.headers["preference-applied"] == "wait=1"
    assert answer.json()["job"]["status"] == "JOB_STATUS_QUEUED"
    assert 0.9 <= took < 3, took
    plain = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=job_body(asset))
    assert plain.status_code == 200
    assert "preference-applied" not in plain.headers
    # A replay that prefers to wait ends when the job does (cancelled here).
    job_id = answer.json()["job"]["jobId"]
    waiting = asyncio.ensure_future(
        http.post(
            f"{edge_url}/v1/jobs",
            headers={**user.headers, "prefer": "wait=20", "idempotency-key": "wait-1"},
            json=job_body(asset),
        )
    )
    await asyncio.sleep(0.5)
    cancelled = await http.post(
        f"{edge_url}/v1/jobs/{job_id}:cancel", headers=user.headers, json={}
    )
    assert cancelled.status_code == 200
    replayed = await asyncio.wait_for(waiting, 10)
    assert replayed.json()["job"]["status"] == "JOB_STATUS_CANCELLED"
    assert replayed.headers["preference-applied"] == "wait=20"


async def test_wait_job_over_grpc_through_the_edge(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    job_id = await submit(http, edge_url, user, await put_input(stack, user.user_id))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.envoy}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        request = creation_service_pb2.WaitJobRequest(
            job_id=job_id, timeout=duration_pb2.Duration(seconds=20)
        )
        waiting = asyncio.ensure_future(stub.WaitJob(request, metadata=bearer(user.token)))
        await asyncio.sleep(0.5)
        await stub.CancelJob(
            creation_service_pb2.CancelJobRequest(job_id=job_id), metadata=bearer(user.token)
        )
        reply = await asyncio.wait_for(waiting, 10)
        assert reply.job.status == job_pb2.JOB_STATUS_CANCELLED
        # The client's own deadline, shorter than the timeout: the job as it is, in time.
        other = await submit(http, edge_url, user, await put_input(stack, user.user_id))
        started = time.monotonic()
        reply = await stub.WaitJob(
            creation_service_pb2.WaitJobRequest(job_id=other, timeout=request.timeout),
            metadata=bearer(user.token),
            timeout=2.5,
        )
        assert reply.job.status == job_pb2.JOB_STATUS_QUEUED
        assert time.monotonic() - started < 2.5
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.WaitJob(
                creation_service_pb2.WaitJobRequest(
                    job_id=other, timeout=duration_pb2.Duration(seconds=90)
                ),
                metadata=bearer(user.token),
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "INVALID_WAIT_TIMEOUT"


async def test_a_queued_job_says_where_it_stands_through_the_edge(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    first = await submit(http, edge_url, user, asset)
    second = await submit(http, edge_url, user, asset)
    got = [
        (await http.get(f"{edge_url}/v1/jobs/{j}", headers=user.headers)).json()["job"]
        for j in (first, second)
    ]
    # The shared queue holds other tests' jobs (which they may cancel meanwhile): only the
    # order is this test's.
    positions = [job.get("queuePosition", 0) for job in got]
    assert positions[1] > positions[0], positions
    listed = (await http.get(f"{edge_url}/v1/jobs", headers=user.headers)).json()["jobs"]
    assert [j["jobId"] for j in listed] == [second, first]
    assert listed[0].get("queuePosition", 0) > listed[1].get("queuePosition", 0)
    await http.post(f"{edge_url}/v1/jobs/{first}:cancel", headers=user.headers, json={})
    cancelled = (await http.get(f"{edge_url}/v1/jobs/{first}", headers=user.headers)).json()
    assert cancelled["job"].get("queuePosition", 0) == 0  # the edge prints zeros too
    assert "estimatedStartTime" not in cancelled["job"]
