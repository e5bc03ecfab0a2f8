"""What the remote worker protocol's keyed calls answer, against a real creation: each of
StartJob, CompleteJob, ReleaseJob and AcknowledgeCancel carries the job's version, the
claim's generation and the server's clock (StartJob also the lease's end), each with the
value the database holds; the raw claim token never reaches the database or the logs; a
token an earlier claim used is refused with CLAIM_TOKEN_REUSED."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf import timestamp_pb2
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import worker_service_pb2 as pb
from atelier.creation.v1 import worker_service_pb2_grpc
from atelier.creation.v1.parameters_pb2 import ParameterValue
from services.creation.domain import Status
from services.creation.store import jobs as jobs_store
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import png
from tests.acceptance.test_remote_workers import (
    API_ENV,
    claim_request,
    put_upload,
    queue,
    refused,
    spec_of,
)
from tests.support.remote_workers import channel, pool_metadata
from tests.support.stacks import stack_of_its_own
from tests.support.workers import read_jobs

# Long enough that no lease runs out while a test walks through its calls.
LEASE_SECONDS = 60
Answer = TypeVar("Answer")
Stub = worker_service_pb2_grpc.WorkerServiceStub


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API alone (no job engine): only the test's calls change its jobs."""
    work = tmp_path_factory.mktemp("remote-answers")
    with stack_of_its_own(postgres_admin_url, work, "api", API_ENV) as stack:
        yield stack


@pytest.fixture
async def db(api: Stack) -> AsyncIterator[AsyncEngine]:
    """The stack's database, with nothing due: a job an earlier test left queued (one that
    failed midway) is cancelled by its owner, so each test claims only its own jobs."""
    engine = create_async_engine(asyncpg_url(api.database_url))
    async with engine.connect() as connection:
        left = (
            await connection.execute(
                text("SELECT user_id, job_id::text FROM creation.jobs WHERE status = 'queued'")
            )
        ).all()
    for user_id, job_id in left:
        await jobs_store.cancel(engine, user_id, job_id, datetime.now(UTC))
    yield engine
    await engine.dispose()


def when(stamp: timestamp_pb2.Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


async def timed(call: Callable[[], Awaitable[Answer]]) -> tuple[Answer, datetime, datetime]:
    """The answer, with the (shared) wall clock just before sending and after it came."""
    before = datetime.now(UTC)
    answer = await call()
    return answer, before, datetime.now(UTC)


async def claim(stub: Stub, request: pb.ClaimJobRequest) -> tuple[pb.ClaimedJob, pb.LeaseRef]:
    job = (await stub.ClaimJob(request, metadata=pool_metadata("gpu"))).job
    assert job.job_id, "a job was due"
    lease = pb.LeaseRef(
        job_id=job.job_id, claim_token=request.claim_token, lease_generation=job.lease_generation
    )
    return job, lease


async def test_keyed_answers_carry_the_version_generation_server_time_and_lease_end(
    api: Stack, db: AsyncEngine
) -> None:
    gpu = pool_metadata("gpu")
    [job_id] = await queue(api, db, users=1, per_user=1)
    async with channel(api) as ch:
        stub = worker_service_pb2_grpc.WorkerServiceStub(ch)

        # Released once, so the second claim's generation (2) differs from the first's.
        job, lease = await claim(stub, claim_request(seconds=LEASE_SECONDS))
        # The job's parameters reach the worker as SubmitJob typed them.
        assert dict(job.parameters) == {"seed": ParameterValue(int_value=3)}
        release = pb.ReleaseJobRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            expected_version=job.version,
        )
        released, before, after = await timed(partial(stub.ReleaseJob, release, metadata=gpu))
        stored = (await read_jobs(db, [job_id]))[job_id]
        assert stored.status is Status.QUEUED
        assert (released.version, released.outcome) == (
            stored.version,
            pb.WORKER_JOB_OUTCOME_QUEUED,
        )
        assert released.lease_generation == 1
        assert before <= when(released.server_time) <= after
        assert await stub.ReleaseJob(release, metadata=gpu) == released  # a replay, unchanged

        job, lease = await claim(stub, claim_request(seconds=LEASE_SECONDS))
        assert (job.job_id, job.lease_generation) == (job_id, 2)
        version = job.version
        for step, provider_request in (
            (pb.WORKER_STEP_SUBMITTING, ""),
            (pb.WORKER_STEP_GENERATING, f"req-{uuid.uuid4()}"),
        ):
            start = pb.StartJobRequest(
                lease=lease,
                worker_id="probe",
                request_id=str(uuid.uuid4()),
                expected_version=version,
                step=step,
                provider_request_id=provider_request,
            )
            started, before, after = await timed(partial(stub.StartJob, start, metadata=gpu))
            stored = (await read_jobs(db, [job_id]))[job_id]
            assert stored.status is Status.RUNNING and stored.lease_expires_at is not None
            assert started.version == stored.version == version + 1
            assert started.lease_generation == 2
            assert before <= when(started.server_time) <= after
            # The lease as the database holds it, which the claim granted (a step does
            # not extend it), still ahead of the server's clock.
            assert when(started.lease_expire_time) == stored.lease_expires_at
            assert when(started.lease_expire_time) == when(job.lease_expire_time)
            assert when(started.lease_expire_time) > when(started.server_time)
            assert await stub.StartJob(start, metadata=gpu) == started
            version = started.version

        data = png()
        prepare = pb.PrepareOutputsRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            outputs=[spec_of(data)] * job.num_outputs,
        )
        uploads = (await stub.PrepareOutputs(prepare, metadata=gpu)).uploads
        for upload in uploads:
            await put_upload(upload, data)
        complete = pb.CompleteJobRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            expected_version=version,
            output_asset_ids=[u.asset_id for u in uploads],
        )
        completed, before, after = await timed(partial(stub.CompleteJob, complete, metadata=gpu))
        stored = (await read_jobs(db, [job_id]))[job_id]
        assert stored.status is Status.SUCCEEDED
        assert (completed.version, completed.outcome) == (
            stored.version,
            pb.WORKER_JOB_OUTCOME_SUCCEEDED,
        )
        assert completed.lease_generation == 2
        assert before <= when(completed.server_time) <= after
        assert await stub.CompleteJob(complete, metadata=gpu) == completed

        # A cancel the owner asked for, acknowledged.
        [job_id] = await queue(api, db, users=1, per_user=1)
        job, lease = await claim(stub, claim_request(seconds=LEASE_SECONDS))
        assert (job.job_id, job.lease_generation) == (job_id, 1)
        owner = (await read_jobs(db, [job_id]))[job_id].user_id
        await jobs_store.cancel(db, owner, job_id, datetime.now(UTC))
        beat = await stub.HeartbeatJob(
            pb.HeartbeatJobRequest(lease=lease, worker_id="probe"), metadata=gpu
        )
        assert beat.cancel_requested
        acknowledge = pb.AcknowledgeCancelRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            expected_version=beat.version,
        )
        acknowledged, before, after = await timed(
            partial(stub.AcknowledgeCancel, acknowledge, metadata=gpu)
        )
        stored = (await read_jobs(db, [job_id]))[job_id]
        assert stored.status is Status.CANCELLED
        assert acknowledged.version == stored.version == beat.version + 1
        assert acknowledged.lease_generation == 1
        assert before <= when(acknowledged.server_time) <= after
        assert await stub.AcknowledgeCancel(acknowledge, metadata=gpu) == acknowledged


async def rows_holding(db: AsyncEngine, needle: str) -> dict[str, int]:
    """Per table of every application schema, how many rows hold ``needle`` in any
    column: each row read as text (every column, whatever its type), and bytea columns
    also for the needle's bytes."""
    found: dict[str, int] = {}
    async with db.connect() as connection:
        tables = (
            await connection.execute(
                text(
                    "SELECT table_schema, table_name FROM information_schema.tables"
                    " WHERE table_type = 'BASE TABLE' AND table_schema NOT IN"
                    " ('pg_catalog', 'information_schema') AND table_schema NOT LIKE 'pg_%'"
                )
            )
        ).all()
        assert len(tables) > 10, tables  # every service's tables, not an empty search
        for schema, table in tables:
            name = f'"{schema}"."{table}"'
            count = (
                await connection.execute(
                    text(
                        f"SELECT count(*) FROM {name} AS t"
                        " WHERE strpos(t::text, :needle) > 0"
                        " OR strpos(t::text, :needle_hex) > 0"
                    ),
                    {"needle": needle, "needle_hex": needle.encode().hex()},
                )
            ).scalar_one()
            if count:
                found[f"{schema}.{table}"] = count
    return found


def logs_holding(log_dir: Path, needle: str) -> list[str]:
    """The stack's log files (one per child) that hold ``needle``."""
    logs = sorted(log_dir.glob("*.log"))
    assert logs, "the stack's children log to files"
    return [p.name for p in logs if needle in p.read_text(errors="replace")]


async def test_the_raw_claim_token_never_reaches_the_database_or_the_logs(
    api: Stack, db: AsyncEngine
) -> None:
    """Guards existing behaviour (the server keeps only the token's SHA-256): a whole
    claim, heartbeat, start, upload and complete cycle leaves no row and no log line
    holding the token, while its hash and the job id are found by the same search."""
    gpu = pool_metadata("gpu")
    [job_id] = await queue(api, db, users=1, per_user=1)
    request = claim_request(seconds=LEASE_SECONDS)
    token = request.claim_token
    async with channel(api) as ch:
        stub = worker_service_pb2_grpc.WorkerServiceStub(ch)
        job, lease = await claim(stub, request)
        assert job.job_id == job_id
        await stub.HeartbeatJob(
            pb.HeartbeatJobRequest(lease=lease, worker_id="probe"), metadata=gpu
        )
        version = job.version
        for step, provider_request in (
            (pb.WORKER_STEP_SUBMITTING, ""),
            (pb.WORKER_STEP_GENERATING, f"req-{uuid.uuid4()}"),
        ):
            start = pb.StartJobRequest(
                lease=lease,
                worker_id="probe",
                request_id=str(uuid.uuid4()),
                expected_version=version,
                step=step,
                provider_request_id=provider_request,
            )
            version = (await stub.StartJob(start, metadata=gpu)).version
        data = png()
        prepare = pb.PrepareOutputsRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            outputs=[spec_of(data)] * job.num_outputs,
        )
        uploads = (await stub.PrepareOutputs(prepare, metadata=gpu)).uploads
        for upload in uploads:
            await put_upload(upload, data)
        complete = pb.CompleteJobRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            expected_version=version,
            output_asset_ids=[u.asset_id for u in uploads],
        )
        assert (await stub.CompleteJob(complete, metadata=gpu)).outcome == (
            pb.WORKER_JOB_OUTCOME_SUCCEEDED
        )

    assert await rows_holding(db, token) == {}
    # The same search finds what is stored: the token's hash, and the job everywhere.
    assert await rows_holding(db, hashlib.sha256(token.encode()).hexdigest()) == {
        "creation.remote_claims": 1
    }
    assert "creation.jobs" in await rows_holding(db, job_id)
    assert api.log_dir is not None
    assert logs_holding(api.log_dir, token) == []
    assert logs_holding(api.log_dir, job_id), "the same search finds the job in the logs"


async def test_a_token_an_earlier_claim_used_is_refused(api: Stack, db: AsyncEngine) -> None:
    """A new claim (a new key) with a token an earlier claim sent, whether that claim took
    a job or found nothing, and from any pool: INVALID_ARGUMENT CLAIM_TOKEN_REUSED, and
    nothing is claimed. The earlier claim's own replay is not a reuse."""
    gpu, office = pool_metadata("gpu"), pool_metadata("office")
    async with channel(api) as ch:
        stub = worker_service_pb2_grpc.WorkerServiceStub(ch)
        empty = claim_request(seconds=LEASE_SECONDS)
        assert not (await stub.ClaimJob(empty, metadata=gpu)).HasField("job")
        [job_id] = await queue(api, db, users=1, per_user=1)
        taken = claim_request(seconds=LEASE_SECONDS)
        job, _ = await claim(stub, taken)
        assert job.job_id == job_id
        [waiting] = await queue(api, db, users=1, per_user=1)

        reused = grpc.StatusCode.INVALID_ARGUMENT, "CLAIM_TOKEN_REUSED"
        for earlier, metadata in ((empty, gpu), (taken, gpu), (taken, office)):
            again = claim_request(seconds=LEASE_SECONDS)
            again.claim_token = earlier.claim_token
            assert await refused(stub.ClaimJob(again, metadata=metadata)) == reused
        assert (await read_jobs(db, [waiting]))[waiting].status is Status.QUEUED

        # The earlier claim's replay answers its job, as before.
        assert (await stub.ClaimJob(taken, metadata=gpu)).job.job_id == job_id
        # A fresh token claims the waiting job.
        job, _ = await claim(stub, claim_request(seconds=LEASE_SECONDS))
        assert job.job_id == waiting
