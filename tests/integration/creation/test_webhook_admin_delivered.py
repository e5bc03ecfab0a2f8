"""What AdminService and SubmitJob set up, delivered by the creation server's own
deliverer to a real receiver that verifies each request with the reference
``standardwebhooks`` package: a test event signed with the secret Create answered, a
redelivery with the same webhook-id, a rotation during which the old secret still
verifies, and a per-job webhook whose job.queued is signed with its owner's key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from google.protobuf import duration_pb2
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    webhook_pb2,
)
from services.kit.identities import entry
from tests.integration.creation.helpers import CreationHarness, new_user, running_creation
from tests.integration.creation.test_webhook_admin import acting, text_job
from tests.integration.creation.webhook_kit import reset
from tests.support.rpc import bearer
from tests.support.webhook_receiver import WebhookReceiver

CREATION = "creation-credential-" + "c" * 24
OPERATOR = "operator-alice-" + "a" * 24
SHOP = "backend-shop-" + "s" * 24
OP = bearer(OPERATOR)
admin_pb = admin_service_pb2
WITHIN = 30.0


@pytest.fixture
async def creation(creation_url: str, engine: AsyncEngine) -> AsyncIterator[CreationHarness]:
    await reset(engine)
    value = json.dumps(
        [
            entry("creation", "creation", (CREATION,)),
            entry("alice", "operator", (OPERATOR,)),
            entry("shop", "backend", (SHOP,), act_for_users=True, per_job_webhooks=True),
        ]
    )
    async with running_creation(
        creation_url,
        ENV="test",
        SERVICE_CREDENTIAL=CREATION,
        SERVICE_IDENTITIES=value,
        # The receiver is plain http on loopback: allowed in tests only.
        WEBHOOK_ALLOW_HTTP="true",
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
        WEBHOOK_POLL="0.2",
        WEBHOOK_RETRY_SCHEDULE="0.2,0.5,1",
    ) as running:
        yield running


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    made = WebhookReceiver([])
    yield made
    made.stop()


@pytest.fixture
async def admin(
    creation: CreationHarness,
) -> AsyncIterator[admin_service_pb2_grpc.AdminServiceStub]:
    async with creation.internal_channel() as channel:
        yield admin_service_pb2_grpc.AdminServiceStub(channel)


async def settled(
    admin: admin_service_pb2_grpc.AdminServiceStub, endpoint_id: str
) -> webhook_pb2.WebhookDelivery:
    """The endpoint's newest delivery once the deliverer has recorded it succeeded (the
    receiver answers before the deliverer writes down its answer; no event says when)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + WITHIN
    while True:
        [newest, *_] = (
            await admin.ListWebhookDeliveries(
                admin_pb.ListWebhookDeliveriesRequest(endpoint_id=endpoint_id, page_size=1),
                metadata=OP,
            )
        ).deliveries
        if newest.state == webhook_pb2.WEBHOOK_DELIVERY_STATE_SUCCEEDED:
            return newest
        assert loop.time() < until, f"not recorded as succeeded: {newest}"
        await asyncio.sleep(0.05)


async def test_a_test_event_verifies_redelivers_with_its_id_and_survives_a_rotation(
    admin: admin_service_pb2_grpc.AdminServiceStub, receiver: WebhookReceiver
) -> None:
    made = await admin.CreateWebhookEndpoint(
        admin_pb.CreateWebhookEndpointRequest(
            endpoint=webhook_pb2.WebhookEndpoint(url=receiver.url, event_types=["job.failed"])
        ),
        metadata=OP,
    )
    endpoint_id = made.endpoint.endpoint_id
    receiver.secrets.append(made.secret)
    sent = (
        await admin.SendTestWebhook(
            admin_pb.SendTestWebhookRequest(endpoint_id=endpoint_id), metadata=OP
        )
    ).delivery
    await receiver.wait_until(lambda r: len(r.accepted()) == 1, WITHIN)
    [first] = receiver.accepted()
    assert (first.webhook_id, first.body["type"]) == (sent.message_id, "webhook.test")
    assert first.body["data"]["status"] == "JOB_STATUS_SUCCEEDED"
    assert receiver.unverified == []

    await settled(admin, endpoint_id)
    # Redelivered: the same webhook-id again.
    await admin.RedeliverWebhooks(
        admin_pb.RedeliverWebhooksRequest(delivery_id=sent.delivery_id, reason="INC-3"),
        metadata=OP,
    )
    await receiver.wait_until(lambda r: len(r.accepted()) == 2, WITHIN)
    assert receiver.accepted()[1].webhook_id == sent.message_id
    shown = await settled(admin, endpoint_id)
    assert (shown.message_id, shown.attempts, shown.last_status_code) == (
        sent.message_id,
        2,
        receiver.accepted()[1].status,
    )

    # Rotated with an overlap: a receiver that knows only the old secret still verifies,
    # and one that knows only the new one too.
    rotated = await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(
            endpoint_id=endpoint_id, overlap=duration_pb2.Duration(seconds=600)
        ),
        metadata=OP,
    )
    receiver.secrets.append(rotated.secret)
    await admin.SendTestWebhook(
        admin_pb.SendTestWebhookRequest(endpoint_id=endpoint_id), metadata=OP
    )
    await receiver.wait_until(lambda r: len(r.accepted()) == 3, WITHIN)
    assert receiver.accepted()[2].verified_by == (0, 1)
    assert receiver.unverified == []


async def test_a_per_job_webhook_delivers_job_queued_signed_with_the_owners_key(
    creation: CreationHarness,
    admin: admin_service_pb2_grpc.AdminServiceStub,
    receiver: WebhookReceiver,
) -> None:
    key = await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(signing_owner="shop"), metadata=OP
    )
    receiver.secrets.append(key.secret)
    user = new_user()
    hook = creation_service_pb2.JobWebhook(url=receiver.url, event_types=["job.queued"])
    async with creation.public_channel() as channel:
        jobs = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await jobs.SubmitJob(text_job(webhook=hook), metadata=acting(SHOP, user))).job
    await receiver.wait_until(lambda r: len(r.accepted()) == 1, WITHIN)
    [queued] = receiver.accepted()
    assert queued.body["type"] == "job.queued"
    assert (queued.body["data"]["jobId"], queued.body["data"]["userId"]) == (job.job_id, user)
    assert receiver.unverified == []
