"""WaitJob and SubmitJob's ``Prefer: wait`` over gRPC, on creation's real listeners and
database: a wait answers as soon as the job settles (woken by the one LISTEN, not by its
fallback re-check), or with the job as it is when its time or the client's deadline is
up; the service's own call deadline does not cut it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc, job_pb2
from services.creation.store import jobs as store
from services.creation.waits import JobWaits, preferred_wait
from tests.integration.creation.helpers import (
    LIMITS,
    T0,
    CreationHarness,
    command,
    new_user,
    running_creation,
    user_token,
)
from tests.integration.creation.test_jobs_service import put_asset, request
from tests.support.media import media_settings, running_media, until
from tests.support.rpc import bad_request, error_info

QUEUED = job_pb2.JOB_STATUS_QUEUED
CANCELLED = job_pb2.JOB_STATUS_CANCELLED


@pytest.fixture
async def creation(creation_url: str) -> AsyncIterator[CreationHarness]:
    # A call deadline shorter than the waits below: they must outlast it.
    async with running_creation(creation_url, CALL_DEADLINE="1") as harness:
        yield harness


def waits_of(creation: CreationHarness) -> JobWaits:
    (waits,) = [c for c in creation.running.app.components if isinstance(c, JobWaits)]
    return waits


async def queued_job(engine: AsyncEngine, user: str) -> str:
    return (await store.submit(engine, user, command(), LIMITS, T0)).job.job_id


def wait_request(job_id: str, seconds: float | None) -> creation_service_pb2.WaitJobRequest:
    request = creation_service_pb2.WaitJobRequest(job_id=job_id)
    if seconds is not None:
        request.timeout.CopyFrom(duration_pb2.Duration(seconds=int(seconds)))
    return request


async def test_a_wait_answers_when_the_job_finishes_woken_at_once(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    job_id = await queued_job(engine, user)
    waits = waits_of(creation)
    await asyncio.wait_for(waits.listener.connected.wait(), 5)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        waiting = asyncio.ensure_future(
            stub.WaitJob(wait_request(job_id, 20), metadata=user_token(user))
        )
        await until(lambda: waits.waiting == 1)
        assert not waiting.done()
        started = time.monotonic()
        await stub.CancelJob(
            creation_service_pb2.CancelJobRequest(job_id=job_id), metadata=user_token(user)
        )
        reply = await asyncio.wait_for(waiting, 5)
        took = time.monotonic() - started
    assert reply.job.job_id == job_id
    assert reply.job.status == CANCELLED
    # The NOTIFY woke it, well before the 2 s fallback re-check.
    assert took < 1.0, took
    assert waits.waiting == 0


async def test_many_waits_share_one_check_per_wake(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    job_ids = [await queued_job(engine, user) for _ in range(20)]
    waits = waits_of(creation)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        waiting = [
            asyncio.ensure_future(stub.WaitJob(wait_request(j, 20), metadata=user_token(user)))
            for j in job_ids
        ]
        await until(lambda: waits.waiting == len(job_ids))
        checks = waits.checks
        for job_id in job_ids:
            await store.cancel(engine, user, job_id, T0)
        replies = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert {r.job.status for r in replies} == {CANCELLED}
    # One statement per wake for all waits, never one per waiting call per change.
    assert waits.checks - checks <= len(job_ids) + 2


async def test_a_wait_that_runs_out_answers_the_job_as_it_is(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    job_id = await queued_job(engine, user)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        started = time.monotonic()
        # 2 s: past the service's call deadline (1 s here), which the wait does not count.
        reply = await stub.WaitJob(wait_request(job_id, 2), metadata=user_token(user))
        took = time.monotonic() - started
        assert reply.job.status == QUEUED and reply.job.job_id == job_id
        assert 1.9 <= took < 3.0, took
        # A zero timeout reads the job at once.
        started = time.monotonic()
        reply = await stub.WaitJob(wait_request(job_id, 0), metadata=user_token(user))
        assert reply.job.status == QUEUED
        assert time.monotonic() - started < 0.5


async def test_a_wait_ends_by_the_clients_deadline(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    job_id = await queued_job(engine, user)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        started = time.monotonic()
        reply = await stub.WaitJob(wait_request(job_id, 30), metadata=user_token(user), timeout=2.5)
        took = time.monotonic() - started
    # Answered (not DEADLINE_EXCEEDED) with the job as it was, before the client gave up.
    assert reply.job.status == QUEUED
    assert 1.2 <= took < 2.5, took


async def test_another_users_job_is_not_found_at_once(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    job_id = await queued_job(engine, new_user())
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.WaitJob(wait_request(job_id, 10), metadata=user_token(new_user()))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "JOB_NOT_FOUND"
    assert time.monotonic() - started < 1.0
    assert waits_of(creation).waiting == 0


@pytest.mark.parametrize(
    "bad",
    [
        duration_pb2.Duration(seconds=61),
        duration_pb2.Duration(seconds=-1),
        duration_pb2.Duration(seconds=0, nanos=-5),
    ],
)
async def test_a_bad_timeout_is_invalid_argument_naming_it(
    creation: CreationHarness, engine: AsyncEngine, bad: duration_pb2.Duration
) -> None:
    user = new_user()
    job_id = await queued_job(engine, user)
    request = creation_service_pb2.WaitJobRequest(job_id=job_id, timeout=bad)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.WaitJob(request, metadata=user_token(user))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_WAIT_TIMEOUT"
    violations = bad_request(caught.value)
    assert violations is not None
    assert [v.field for v in violations.field_violations] == ["timeout"]


async def test_a_bad_job_id_is_invalid_argument(creation: CreationHarness) -> None:
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.WaitJob(wait_request("nope", 1), metadata=user_token(new_user()))
    assert error_info(caught.value).reason == "INVALID_JOB_ID"


async def test_submit_with_prefer_wait_answers_after_the_wait_and_says_so(
    creation_url: str, media_url: str, tmp_path: Path
) -> None:
    user = new_user()
    async with (
        running_media(media_settings(media_url, tmp_path)) as media,
        running_creation(
            creation_url, media_address=f"127.0.0.1:{media.running.internal_port}"
        ) as creation,
        creation.public_channel() as channel,
    ):
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        asset = await put_asset(media, user)
        started = time.monotonic()
        call = stub.SubmitJob(
            request(asset, "prefer-1"), metadata=(*user_token(user), ("prefer", "wait=1"))
        )
        reply = await call
        took = time.monotonic() - started
        # No worker here: the job is as it was when the second ran out.
        assert reply.job.status == QUEUED
        assert 0.9 <= took < 2.5, took
        assert ("preference-applied", "wait=1") in tuple(await call.initial_metadata())
        # A Prefer it does not understand is ignored: at once, and not said to be applied.
        started = time.monotonic()
        call = stub.SubmitJob(
            request(asset, "prefer-2"), metadata=(*user_token(user), ("prefer", "wait=later"))
        )
        await call
        assert time.monotonic() - started < 0.9
        assert "preference-applied" not in dict(await call.initial_metadata())
        # A replay with Prefer waits for the job it made, which a cancel ends at once.
        job_id = reply.job.job_id
        waiting = asyncio.ensure_future(
            stub.SubmitJob(
                request(asset, "prefer-1"), metadata=(*user_token(user), ("prefer", "wait=20"))
            )
        )
        await until(lambda: waits_of(creation).waiting == 1)
        await stub.CancelJob(
            creation_service_pb2.CancelJobRequest(job_id=job_id), metadata=user_token(user)
        )
        replayed = await asyncio.wait_for(waiting, 5)
        assert replayed.job.job_id == job_id and replayed.job.status == CANCELLED


def test_prefer_wait_is_read_as_rfc_7240_says() -> None:
    assert preferred_wait([]) is None
    assert preferred_wait(["wait=5"]) == 5
    assert preferred_wait(['respond-async, wait="7"']) == 7
    assert preferred_wait(["handling=lenient; x=1, WAIT = 3"]) == 3
    assert preferred_wait(["wait=600"]) == 60  # at most a minute
    assert preferred_wait(["wait=2", "wait=9"]) == 2  # the first one counts
    assert preferred_wait(["wait=soon"]) is None  # not understood: ignored
    assert preferred_wait(["wait"]) is None
    assert preferred_wait(["waiting=4"]) is None
    assert preferred_wait(["return=minimal"]) is None


async def test_the_waits_component_stops_at_once(creation_url: str, engine: AsyncEngine) -> None:
    waits = JobWaits(engine, creation_url, recheck_seconds=30)
    running = asyncio.ensure_future(waits.run())
    await asyncio.wait_for(waits.listener.connected.wait(), 10)
    started = time.monotonic()
    await waits.stop(asyncio.get_running_loop().time() + 5)
    await asyncio.wait_for(running, 5)
    # Not after the 30 s re-check period: a stopping server does not wait it out.
    assert time.monotonic() - started < 2
