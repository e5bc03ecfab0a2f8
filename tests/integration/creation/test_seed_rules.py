"""What the seeds ask of jobs and the code once did not do, on real PostgreSQL: a
cancelled job gives its daily-quota slot back, one job per provider request, the adapter's
version on the job, a claim order with no ties and a claim batch no bad row aborts, and a
video model refused at submit (through creation's real listeners)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.creation.domain import Status
from services.creation.errors import DailyQuotaExceeded
from services.creation.media_client import MediaClient
from services.creation.remote.service import CallKey, LeaseClaim, RemoteJobs
from services.creation.remote.settings import RemoteSettings
from services.creation.store import jobs as store
from services.creation.store import leases, ledger
from services.creation.store.fenced import FencedItem, FencedWrite
from services.creation.store.jobs import SubmitLimits
from services.kit.clock import SettableClock
from services.kit.errors import ApiError
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.integration.creation.helpers import (
    LIMITS,
    T0,
    command,
    new_user,
    running_creation,
    user_token,
)
from tests.support.rpc import bad_request, error_info

TTL = timedelta(seconds=30)


async def test_a_cancelled_job_gives_its_daily_quota_slot_back(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=2, in_flight_limit=10, max_attempts=3, welcome_points=100)
    first = await store.submit(engine, user, command(), limits, T0)
    await store.submit(engine, user, command(), limits, T0)
    cancelled = await store.cancel(engine, user, first.job.job_id, T0)
    assert cancelled.job.status is Status.CANCELLED
    # The balance's count agrees with the submit's.
    balance = await ledger.read_balance(engine, user, 100, T0)
    assert balance.jobs_today == 1
    await store.submit(engine, user, command(), limits, T0)
    with pytest.raises(DailyQuotaExceeded):
        await store.submit(engine, user, command(), limits, T0)


async def claim_all(engine: AsyncEngine, n: int) -> list[str]:
    for _ in range(n):
        await store.submit(engine, new_user(), command(), LIMITS, T0)
    claimed = await leases.claim(engine, "w1", n, TTL, T0)
    assert len(claimed) == n
    return [job.job_id for job in claimed]


async def record(engine: AsyncEngine, job_id: str, request_id: str) -> None:
    async with engine.connect() as connection:
        epoch = (
            await connection.execute(
                text("SELECT lease_epoch FROM creation.jobs WHERE job_id = :j"), {"j": job_id}
            )
        ).scalar_one()
    for write, value in (
        (FencedWrite.MARK_SUBMITTING, "v"),
        (FencedWrite.RECORD_REQUEST, request_id),
    ):
        written = await leases.apply(engine, write, [FencedItem(job_id, epoch, value)], T0)
        assert job_id in written


async def test_a_provider_request_belongs_to_one_job(engine: AsyncEngine) -> None:
    a, b, c = await claim_all(engine, 3)
    await record(engine, a, "gen-1")
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        await record(engine, b, "gen-1")
    assert caught.value.constraint_name == "uq_jobs_provider_request"
    # The same id at another provider is another request.
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE creation.jobs SET provider_code = 'fal' WHERE job_id = :j"), {"j": c}
        )
    await record(engine, c, "gen-1")
    await record(engine, b, "gen-2")


async def test_submitting_records_the_adapters_version(engine: AsyncEngine) -> None:
    (job_id,) = await claim_all(engine, 1)
    epoch = 1
    written = await leases.apply(
        engine, FencedWrite.MARK_SUBMITTING, [FencedItem(job_id, epoch, "stub-7")], T0
    )
    assert written[job_id].provider_version == "stub-7"


async def test_jobs_due_together_are_claimed_in_job_id_order(engine: AsyncEngine) -> None:
    # Same priority, due time and creation time: only the job id tells them apart.
    made = [(await store.submit(engine, new_user(), command(), LIMITS, T0)).job for _ in range(8)]
    assert len({(j.priority, j.next_attempt_at, j.created_at) for j in made}) == 1
    one_by_one = [job.job_id for _ in made for job in await leases.claim(engine, "w", 1, TTL, T0)]
    assert one_by_one == sorted(j.job_id for j in made)


async def test_a_job_with_no_attempt_left_does_not_abort_the_claim(engine: AsyncEngine) -> None:
    """A queued job whose attempts are used up and that holds no provider request would
    start an attempt past max_attempts (ck_jobs_attempts_bounded): passed over, the rest
    of the batch is claimed. One that holds a request resumes it in the same attempt."""
    made = [(await store.submit(engine, new_user(), command(), LIMITS, T0)).job for _ in range(4)]
    spent, resuming = made[0].job_id, made[1].job_id
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE creation.jobs SET attempt = max_attempts WHERE job_id = :j"), {"j": spent}
        )
        await connection.execute(
            text(
                "UPDATE creation.jobs SET attempt = max_attempts, step = 'generating',"
                " provider_request_id = 'gen-' || job_id WHERE job_id = :j"
            ),
            {"j": resuming},
        )
    claimed = await leases.claim(engine, "w", 10, TTL, T0)
    assert sorted(j.job_id for j in claimed) == sorted(j.job_id for j in made[1:])
    resumed = next(j for j in claimed if j.job_id == resuming)
    assert (resumed.attempt, resumed.step) == (LIMITS.max_attempts, "generating")


VIDEO_MODEL = "video-test"


@pytest.fixture
async def video_model(engine: AsyncEngine) -> AsyncIterator[str]:
    """An enabled video model (and a video style) in the catalog."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO creation.models (model_id, display_name, media_kind,"
                " price_points, provider_code, provider_model)"
                " VALUES (:id, 'Video', 'video', 5, 'stub', 'video')"
            ),
            {"id": VIDEO_MODEL},
        )
        await connection.execute(
            text(
                "INSERT INTO creation.styles (style_id, display_name, media_kind)"
                " VALUES (:id, 'Film', 'video')"
            ),
            {"id": VIDEO_MODEL},
        )
    yield VIDEO_MODEL
    async with engine.begin() as connection:
        await connection.execute(
            text("DELETE FROM creation.jobs WHERE model_id = :id"), {"id": VIDEO_MODEL}
        )
        await connection.execute(
            text("DELETE FROM creation.models WHERE model_id = :id"), {"id": VIDEO_MODEL}
        )
        await connection.execute(
            text("DELETE FROM creation.styles WHERE style_id = :id"), {"id": VIDEO_MODEL}
        )


async def test_a_video_model_is_refused_at_submit(
    engine: AsyncEngine, creation_url: str, video_model: str
) -> None:
    user = new_user()
    request = creation_service_pb2.SubmitJobRequest(
        model_id=video_model,
        style_id=video_model,
        input_asset_id=str(uuid.uuid4()),
        prompt="a cat walking",
        width=512,
        height=512,
    )
    async with running_creation(creation_url) as creation, creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(request, metadata=user_token(user))
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(error).reason == "MEDIA_KIND_NOT_SUPPORTED"
    violations = bad_request(error)
    assert violations is not None
    assert [v.field for v in violations.field_violations] == ["model_id"]
    async with engine.connect() as connection:
        made = await connection.execute(
            text("SELECT count(*) FROM creation.jobs WHERE user_id = :u"), {"u": user}
        )
        assert made.scalar_one() == 0


async def test_a_remote_worker_records_its_version_and_cannot_take_a_held_request(
    engine: AsyncEngine,
) -> None:
    """StartJob SUBMITTING records the worker's adapter version; GENERATING with a request
    id another job holds is INVALID_ARGUMENT on provider_request_id (not a reused key)."""
    for _ in range(2):
        await store.submit(engine, new_user(), command(), LIMITS, T0)
    clock = SettableClock(T0 + timedelta(minutes=1))
    media = MediaClient("127.0.0.1:9", DEV_SERVICE_TOKEN)  # never called by these calls
    remote = RemoteSettings(retention_seconds=7 * 86400)
    jobs = RemoteJobs(engine, media, remote, clock, backoff_base_seconds=1, backoff_max_seconds=2)
    held = []
    for n, token in enumerate(("a" * 64, "b" * 64)):
        claimed = await jobs.claim("gpu", f"claim-{n}", token, "w", 60)
        assert claimed is not None
        claim = LeaseClaim("gpu", "w", claimed.job_id, token, claimed.lease_epoch)
        await jobs.start(
            claim,
            CallKey(f"submitting-{n}", "StartJob", f"s{n}"),
            claimed.version,
            None,
            lambda _: b"s",
            provider_version="stub-9",
        )
        held.append((claim, claimed.version + 1))
    versions = await engine_rows(engine, "provider_version")
    assert versions == ["stub-9", "stub-9"]
    (first, first_version), (second, second_version) = held
    await jobs.start(
        first, CallKey("gen-a", "StartJob", "g"), first_version, "gen-1", lambda _: b"g"
    )
    with pytest.raises(ApiError) as caught:
        await jobs.start(
            second, CallKey("gen-b", "StartJob", "g"), second_version, "gen-1", lambda _: b"g"
        )
    error = caught.value
    assert (error.code, error.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_WORKER_REQUEST",
    )
    assert [v.field for v in error.violations] == ["provider_request_id"]


async def engine_rows(engine: AsyncEngine, column: str) -> list[str | None]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {column} FROM creation.jobs"))
        return list(found.scalars())
