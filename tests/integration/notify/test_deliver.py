"""NotifyIngestService.Deliver over a real notify server: only our own services may call
it (the service credential, the internal listener only); it applies a batch to the
projection and announces what moved, once that is committed; a batch no outbox could have
written is refused with field violations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from atelier.notify.v1 import notify_ingest_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.notify.projection import AppliedState
from services.notify.tables import job_states
from tests.support.notify import (
    NotifyHarness,
    RecordingPublisher,
    job_state,
    new_job_id,
    running_notify,
)
from tests.support.rpc import bad_request, bearer, error_info

SERVICE = bearer(DEV_SERVICE_TOKEN)
Stub = notify_ingest_service_pb2_grpc.NotifyIngestServiceStub


class CheckingPublisher(RecordingPublisher):
    """Reads each announced row from another connection: it must be committed already."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__()
        self.engine = engine
        self.visible: list[int] = []

    async def publish(self, applied: Sequence[AppliedState]) -> None:
        async with self.engine.connect() as connection:
            for change in applied:
                row = (
                    await connection.execute(
                        select(job_states.c.version).where(job_states.c.job_id == change.job_id)
                    )
                ).scalar_one()
                self.visible.append(int(row))
        await super().publish(applied)


@pytest.fixture
async def notify(notify_url: str, engine: AsyncEngine) -> AsyncIterator[NotifyHarness]:
    async with running_notify(notify_url, CheckingPublisher(engine)) as harness:
        yield harness


def messages(*states: job_pb2.Job) -> pb.DeliverRequest:
    return pb.DeliverRequest(
        messages=[pb.OutboxMessage(outbox_id=i + 1, job=s) for i, s in enumerate(states)]
    )


async def test_deliver_applies_and_announces_what_moved_after_commit(
    notify: NotifyHarness,
) -> None:
    a, b = new_job_id(), new_job_id()
    async with notify.internal_channel() as channel:
        stub = Stub(channel)
        reply = await stub.Deliver(
            messages(job_state(a, 1), job_state(a, 2), job_state(b, 1)), metadata=SERVICE
        )
        assert reply.applied_count == 2
        again = await stub.Deliver(messages(job_state(a, 1), job_state(b, 1)), metadata=SERVICE)
        assert again.applied_count == 0
    publisher = notify.publisher
    assert isinstance(publisher, CheckingPublisher)
    assert publisher.versions() == {a: [2], b: [1]}
    assert publisher.visible == [p.version for p in publisher.published]


async def test_deliver_wants_the_service_credential(notify: NotifyHarness) -> None:
    request = messages(job_state(new_job_id(), 1))
    user = bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "mallory", 600))
    async with notify.internal_channel() as channel:
        for metadata, reason in (
            ((), "SERVICE_CREDENTIAL_MISSING"),
            (user, "SERVICE_CREDENTIAL_INVALID"),
            (bearer("not-the-token"), "SERVICE_CREDENTIAL_INVALID"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await Stub(channel).Deliver(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_info(refused.value).reason == reason
    # The public listener (the one the edge routes to) does not serve it at all.
    async with notify.public_channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await Stub(channel).Deliver(request, metadata=user)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert notify.publisher.published == []


async def test_a_batch_no_outbox_could_write_is_refused_field_by_field(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    good = job_state(new_job_id(), 1)
    bad = job_state("not-a-uuid", 0, user_id="", status=job_pb2.JOB_STATUS_UNSPECIFIED)
    async with notify.internal_channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await Stub(channel).Deliver(
                pb.DeliverRequest(
                    messages=[
                        pb.OutboxMessage(outbox_id=1, job=good),
                        pb.OutboxMessage(outbox_id=2, job=bad),
                        pb.OutboxMessage(outbox_id=3),
                    ]
                ),
                metadata=SERVICE,
            )
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await Stub(channel).Deliver(pb.DeliverRequest(), metadata=SERVICE)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(refused.value).reason == "INVALID_DELIVERY"
    found = bad_request(refused.value)
    assert found is not None
    assert [v.field for v in found.field_violations] == [
        "messages[1].job.job_id",
        "messages[1].job.user_id",
        "messages[1].job.version",
        "messages[1].job.status",
        "messages[2].job",
    ]
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Nothing of a refused batch is applied, not even its good part.
    async with engine.connect() as connection:
        assert (await connection.execute(select(job_states))).all() == []


async def test_a_job_id_no_outbox_writes_is_refused_however_uuid_could_read_it(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    """The outbox writes ids as PostgreSQL prints them; braces (which Python's uuid and
    PostgreSQL both read) are another spelling, refused by the kit's one rule."""
    braced = job_state(f"{{{new_job_id()}}}", 1)
    async with notify.internal_channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await Stub(channel).Deliver(
                pb.DeliverRequest(messages=[pb.OutboxMessage(outbox_id=1, job=braced)]),
                metadata=SERVICE,
            )
    assert error_info(refused.value).reason == "INVALID_DELIVERY"
    found = bad_request(refused.value)
    assert found is not None
    assert [v.field for v in found.field_violations] == ["messages[0].job.job_id"]
    async with engine.connect() as connection:
        assert (await connection.execute(select(job_states))).all() == []
