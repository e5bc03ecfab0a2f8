"""The call deadline of the kit's server stack, with a PostgreSQL of the test's own that it
freezes (SIGSTOP): a call answers UNAVAILABLE (DATABASE_UNAVAILABLE, RetryInfo) by its
deadline however many waits it makes in a row and however many calls queue for the pool,
a client's shorter deadline is ours too, the connections it gave up on go back to the pool
(none stays checked out), and a stream is bounded until its first message only.

Each handler here makes two database steps in a row, each with the default step bounds
(2 s pool checkout, 2 s statement, 1.5 s connect): every one of them alone outlasts the
1 s deadline these tests give the service.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from atelier.creation.v1 import job_pb2
from atelier.media.v1 import media_internal_service_pb2 as pb
from atelier.media.v1 import media_internal_service_pb2_grpc as pb_grpc
from services.dev import postgres
from services.kit.db import Database, asyncpg_url, fetch
from services.kit.server import Binding, RunningService, ServiceApp
from services.kit.settings import DEV_SERVICE_TOKEN, CommonSettings, EnvReader, ListenSettings
from tests.support import notify_streams
from tests.support.databases import migrated_database
from tests.support.pg_outage import OwnPostgres
from tests.support.projection import apply, ensure_table, job_state
from tests.support.rpc import bearer, error_info, retry_delay
from tests.support.workers import until

DEADLINE = 1.0
# What a loaded machine may add to the deadline before the answer is read; each step's
# own bound (2 s) is past it, so a call that waits step by step cannot pass.
SLACK = 0.8
POOL_SIZE = 4
CALLS = 32
CREDENTIAL = bearer(DEV_SERVICE_TOKEN)


class DatabaseSteps(pb_grpc.MediaInternalServiceServicer):
    """Methods that do what real ones do with the database: two reads in a row (unary),
    a read then a stream of messages paced by the handler (server streaming), messages
    paced by the client then a read (client streaming)."""

    def __init__(self, database: Database) -> None:
        self._engine = database.engine

    async def _two_reads(self) -> None:
        await fetch(self._engine, text("SELECT 1"))
        async with self._engine.begin() as connection:
            await connection.execute(text("SELECT 2"))

    async def GetAssetInfo(
        self, request: pb.GetAssetInfoRequest, context: Any
    ) -> pb.GetAssetInfoResponse:
        await self._two_reads()
        return pb.GetAssetInfoResponse()

    async def ReadAsset(
        self, request: pb.ReadAssetRequest, context: Any
    ) -> AsyncIterator[pb.ReadAssetResponse]:
        await self._two_reads()
        yield pb.ReadAssetResponse(chunk=b"first")
        # The stream's life, past the deadline: not the deadline's business.
        await asyncio.sleep(DEADLINE * 1.5)
        yield pb.ReadAssetResponse(chunk=b"second")

    async def PutAsset(
        self, request_iterator: AsyncIterable[pb.PutAssetRequest], context: Any
    ) -> pb.PutAssetResponse:
        async for _ in request_iterator:
            pass
        await self._two_reads()
        return pb.PutAssetResponse()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[tuple[OwnPostgres, str]]:
    pg = OwnPostgres()
    try:
        yield pg, postgres.ensure_database(pg.admin_url, "atelier")
    finally:
        pg.close()


@pytest.fixture
async def served(own_postgres: tuple[OwnPostgres, str]) -> AsyncIterator[tuple[Database, str]]:
    _, url = own_postgres
    common = CommonSettings.read(
        EnvReader(
            {
                "ATELIER_DRAIN_GRACE": "0",
                "ATELIER_CALL_DEADLINE": str(DEADLINE),
                "ATELIER_DB_POOL_SIZE": str(POOL_SIZE),
            }
        )
    )
    database = Database(url, "call-deadline-test", limits=common.database)
    binding = Binding(
        pb.DESCRIPTOR.services_by_name["MediaInternalService"],
        pb_grpc.add_MediaInternalServiceServicer_to_server,
        DatabaseSteps(database),
    )
    app = ServiceApp(name="deadline-test", public=[], internal=[binding], serve_public=False)
    service = RunningService(app, common, ListenSettings(0, 0, 0))
    await service.start()
    try:
        yield database, f"127.0.0.1:{service.internal_port}"
    finally:
        await service.stop()
        await database.close()


async def _timed(call: Any) -> tuple[float, grpc.aio.AioRpcError | None]:
    started = time.monotonic()
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return time.monotonic() - started, error
    return time.monotonic() - started, None


def _database_unavailable(seconds: float, error: grpc.aio.AioRpcError | None, bound: float) -> None:
    assert error is not None, f"answered OK in {seconds:.2f}s with the database frozen"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    assert error_info(error).reason == "DATABASE_UNAVAILABLE"
    assert (retry_delay(error) or 0) > 0
    assert seconds < bound, f"answered in {seconds:.2f}s, over {bound:g}s"


async def test_every_call_answers_by_its_deadline_with_the_database_frozen(
    own_postgres: tuple[OwnPostgres, str], served: tuple[Database, str]
) -> None:
    pg, _ = own_postgres
    database, address = served
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.MediaInternalServiceStub(channel)
        # The pool holds its connections before the freeze, as in a running service.
        await stub.GetAssetInfo(pb.GetAssetInfoRequest(), metadata=CREDENTIAL, timeout=10)
        pg.freeze()
        try:
            answers = await asyncio.gather(
                *(
                    _timed(
                        stub.GetAssetInfo(pb.GetAssetInfoRequest(), metadata=CREDENTIAL, timeout=10)
                    )
                    for _ in range(CALLS)
                )
            )
            # A client that allows less than the service's deadline has its answer in time.
            short = await _timed(
                stub.GetAssetInfo(pb.GetAssetInfoRequest(), metadata=CREDENTIAL, timeout=0.6)
            )
        finally:
            pg.thaw()
        print("max", max(seconds for seconds, _ in answers))  # figures for the report (-s)
        for seconds, error in answers:
            _database_unavailable(seconds, error, DEADLINE + SLACK)
        _database_unavailable(*short, 0.6)

        # Whatever the cancelled calls held went back to the pool: none is checked out,
        # and the next calls are served from it (more at once than it holds).
        async def checked_in() -> bool | None:
            return True if database.engine.pool.checkedout() == 0 else None  # type: ignore[attr-defined]

        await until(checked_in, 5, "every connection back in the pool")
        await until(
            lambda: _ok(
                stub.GetAssetInfo(pb.GetAssetInfoRequest(), metadata=CREDENTIAL, timeout=5)
            ),
            10,
            "a call served again",
        )
        again = await asyncio.gather(
            *(
                _timed(stub.GetAssetInfo(pb.GetAssetInfoRequest(), metadata=CREDENTIAL, timeout=5))
                for _ in range(POOL_SIZE * 4)
            )
        )
        assert [error for _, error in again] == [None] * len(again)
        assert database.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def _ok(call: Any) -> bool | None:
    _, error = await _timed(call)
    return True if error is None else None


async def test_a_stream_is_bounded_until_its_first_message(
    own_postgres: tuple[OwnPostgres, str], served: tuple[Database, str]
) -> None:
    pg, _ = own_postgres
    _, address = served
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.MediaInternalServiceStub(channel)
        # Live: the second message comes after the deadline, and the stream ends well.
        chunks = [
            m.chunk
            async for m in stub.ReadAsset(pb.ReadAssetRequest(), metadata=CREDENTIAL, timeout=10)
        ]
        assert chunks == [b"first", b"second"]
        pg.freeze()
        try:
            stream = stub.ReadAsset(pb.ReadAssetRequest(), metadata=CREDENTIAL, timeout=10)
            answer = await _timed(_drain(stream))
        finally:
            pg.thaw()
        _database_unavailable(*answer, DEADLINE + SLACK)


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_a_client_stream_is_not_timed_while_the_client_sends(
    served: tuple[Database, str],
) -> None:
    _, address = served

    async def slow_upload() -> AsyncIterator[pb.PutAssetRequest]:
        for _ in range(3):
            yield pb.PutAssetRequest(chunk=b"x")
            await asyncio.sleep(DEADLINE * 0.6)  # the client's pace, 1.8 deadlines in all

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.MediaInternalServiceStub(channel)
        seconds, error = await _timed(stub.PutAsset(slow_upload(), metadata=CREDENTIAL, timeout=10))
    assert error is None, (error.code(), error.details())
    assert seconds > DEADLINE


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


async def test_a_watch_waits_for_a_new_job_past_the_call_deadline(notify_url: str) -> None:
    """WatchJob on a job whose first state is still on its way waits for it (up to
    first_state_wait): that wait is what the caller asked for, so the call's deadline,
    shorter here, does not cut it."""
    user, job = f"user-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    chosen = notify_streams.settings(notify_url, first_state_wait_seconds=DEADLINE * 5)
    chosen = replace(chosen, common=replace(chosen.common, call_deadline_seconds=DEADLINE))
    engine = create_async_engine(asyncpg_url(notify_url))
    try:
        await ensure_table(engine)
        async with notify_streams.replica(chosen) as rep:
            reader = notify_streams.watch_job(rep, user, job)
            # The job appears after the deadline would have passed.
            await asyncio.sleep(DEADLINE * 1.5)
            applied = await apply(engine, [job_state(job, user, 1, job_pb2.JOB_STATUS_QUEUED)])
            await rep.streams.publisher.publish(applied)
            assert (await reader.next()).job.version == 1
            assert reader.error is None
    finally:
        await engine.dispose()
