"""A queued job's standing on creation's reads, over gRPC on its real listeners and
database: its position in claim order among the jobs ahead of it, and a start estimate
from the recent claim rate (none without claims lately); finished and running jobs have
neither. The reads that carry it (GetJob, ListJobs, WaitJob) still answer under the
harness's frozen clock, with media nowhere (the hang an earlier build had). notify's
streams ask the same by job id on the internal listener (QueueStandingService)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    creation_service_pb2,
    creation_service_pb2_grpc,
    job_pb2,
    queue_standing_service_pb2,
    queue_standing_service_pb2_grpc,
)
from services.creation.queue_standing import RATE_WINDOW_SECONDS
from services.creation.store import jobs as store
from services.creation.store import leases
from tests.integration.creation.helpers import (
    LIMITS,
    SERVICE,
    T0,
    CreationHarness,
    command,
    new_user,
    running_creation,
    user_token,
)
from tests.support.rpc import bad_request, error_info

TTL = timedelta(seconds=30)


@pytest.fixture
async def creation(creation_url: str) -> AsyncIterator[CreationHarness]:
    async with running_creation(creation_url) as harness:
        yield harness


async def submitted(engine: AsyncEngine, user: str, seconds: int) -> str:
    made = await store.submit(engine, user, command(), LIMITS, T0 + timedelta(seconds=seconds))
    return made.job.job_id


async def test_positions_follow_claim_order_on_get_list_and_wait(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user, other = new_user(), new_user()
    first = await submitted(engine, user, 0)
    theirs = await submitted(engine, other, 1)  # another user's job is ahead all the same
    second = await submitted(engine, user, 2)
    third = await submitted(engine, user, 3)
    creation.clock.set(T0 + timedelta(seconds=10))
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        got = await stub.GetJob(
            creation_service_pb2.GetJobRequest(job_id=second), metadata=user_token(user)
        )
        assert got.job.queue_position == 2
        # No job was claimed lately: no rate to estimate from.
        assert not got.job.HasField("estimated_start_time")
        listed = await stub.ListJobs(
            creation_service_pb2.ListJobsRequest(), metadata=user_token(user)
        )
        assert [(j.job_id, j.queue_position) for j in listed.jobs] == [
            (third, 3),
            (second, 2),
            (first, 0),
        ]
        # The first job is cancelled: everyone behind moves up; it has no standing.
        await stub.CancelJob(
            creation_service_pb2.CancelJobRequest(job_id=first), metadata=user_token(user)
        )
        waited = await stub.WaitJob(
            creation_service_pb2.WaitJobRequest(job_id=third, timeout={"seconds": 0}),
            metadata=user_token(user),
        )
        assert waited.job.queue_position == 2
        listed = await stub.ListJobs(
            creation_service_pb2.ListJobsRequest(), metadata=user_token(user)
        )
        cancelled = next(j for j in listed.jobs if j.job_id == first)
        assert cancelled.status == job_pb2.JOB_STATUS_CANCELLED
        assert cancelled.queue_position == 0 and not cancelled.HasField("estimated_start_time")
        assert {j.job_id: j.queue_position for j in listed.jobs}[second] == 1
    assert theirs


async def test_the_estimate_follows_the_recent_claim_rate(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    claimed = await submitted(engine, user, 0)
    waiting = [await submitted(engine, user, n) for n in (1, 2)]
    now = T0 + timedelta(seconds=20)
    (running,) = await leases.claim(engine, "worker-1", 1, TTL, now)
    assert running.job_id == claimed
    creation.clock.set(now)
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        got = [
            (
                await stub.GetJob(
                    creation_service_pb2.GetJobRequest(job_id=j), metadata=user_token(user)
                )
            ).job
            for j in [claimed, *waiting]
        ]
    assert got[0].status == job_pb2.JOB_STATUS_RUNNING
    assert got[0].queue_position == 0 and not got[0].HasField("estimated_start_time")
    # One claim within the last 5 minutes: one job per 300 s, so the next starts in 300 s
    # and the one behind it in 600 s.
    per_job = timedelta(seconds=RATE_WINDOW_SECONDS)
    assert [j.queue_position for j in got[1:]] == [0, 1]
    assert [j.estimated_start_time.ToDatetime(tzinfo=T0.tzinfo) for j in got[1:]] == [
        now + per_job,
        now + 2 * per_job,
    ]


async def test_a_job_waiting_for_its_next_attempt_starts_no_sooner(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    job_id = await submitted(engine, user, 0)
    (held,) = await leases.claim(engine, "worker-1", 1, TTL, T0)
    later = T0 + timedelta(hours=1)
    await leases.hand_back(engine, job_id, held.lease_epoch, timedelta(hours=1), T0)
    creation.clock.set(T0 + timedelta(seconds=5))
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (
            await stub.GetJob(
                creation_service_pb2.GetJobRequest(job_id=job_id), metadata=user_token(user)
            )
        ).job
    assert job.status == job_pb2.JOB_STATUS_QUEUED
    assert job.next_attempt_time.ToDatetime(tzinfo=T0.tzinfo) == later
    assert job.estimated_start_time.ToDatetime(tzinfo=T0.tzinfo) == later


async def get_standings(
    creation: CreationHarness, job_ids: list[str], metadata: object = SERVICE
) -> queue_standing_service_pb2.GetQueueStandingsResponse:
    async with creation.internal_channel() as channel:
        stub = queue_standing_service_pb2_grpc.QueueStandingServiceStub(channel)
        return await stub.GetQueueStandings(
            queue_standing_service_pb2.GetQueueStandingsRequest(job_ids=job_ids),
            metadata=metadata,
        )


async def test_standings_by_id_are_what_the_reads_say_for_queued_jobs_only(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    claimed = await submitted(engine, user, 0)
    first, second = await submitted(engine, user, 1), await submitted(engine, user, 2)
    cancelled = await submitted(engine, user, 3)
    await store.cancel(engine, user, cancelled, T0 + timedelta(seconds=4))
    now = T0 + timedelta(seconds=20)
    (running,) = await leases.claim(engine, "worker-1", 1, TTL, now)
    assert running.job_id == claimed
    creation.clock.set(now)
    unknown = "6f1c1e2a-5b7d-4c3e-9a8b-0d1e2f3a4b5c"
    answer = await get_standings(creation, [second.upper(), first, claimed, cancelled, unknown])
    placed = {s.job_id: s for s in answer.standings}
    # The running, cancelled and unknown jobs have none; ids are read in any case.
    assert sorted(placed) == sorted([first, second])
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        for job_id in (first, second):
            job = (
                await stub.GetJob(
                    creation_service_pb2.GetJobRequest(job_id=job_id), metadata=user_token(user)
                )
            ).job
            assert (placed[job_id].version, placed[job_id].queue_position) == (
                job.version,
                job.queue_position,
            )
            assert placed[job_id].estimated_start_time == job.estimated_start_time
    assert [placed[j].queue_position for j in (first, second)] == [0, 1]
    per_job = timedelta(seconds=RATE_WINDOW_SECONDS)
    assert placed[second].estimated_start_time.ToDatetime(tzinfo=T0.tzinfo) == now + 2 * per_job


@pytest.mark.parametrize(
    ("job_ids", "field"),
    [
        ([], "job_ids"),
        (["6f1c1e2a-5b7d-4c3e-9a8b-0d1e2f3a4b5c"] * 201, "job_ids"),
        (["6f1c1e2a-5b7d-4c3e-9a8b-0d1e2f3a4b5c", "nope"], "job_ids[1]"),
    ],
)
async def test_standings_by_id_refuse_a_bad_request(
    creation: CreationHarness, job_ids: list[str], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await get_standings(creation, job_ids)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_JOB_ID"
    details = bad_request(caught.value)
    assert details is not None and [v.field for v in details.field_violations] == [field]


async def test_standings_by_id_need_the_service_credential(creation: CreationHarness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await get_standings(
            creation, ["6f1c1e2a-5b7d-4c3e-9a8b-0d1e2f3a4b5c"], user_token(new_user())
        )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
