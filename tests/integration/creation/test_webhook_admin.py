"""AdminService's webhook RPCs over a real creation server and PostgreSQL: endpoints
(create, get, list, update by mask, delete), secrets (shown by Create and Rotate only,
never logged; the previous one kept for the overlap), test events, the delivery log and
redelivery; operators only. And SubmitJob's per-job webhook: honoured for a backend with
per_job_webhooks acting for a user, refused for a user and for a backend without it."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    webhook_pb2,
)
from services.creation.tables import webhook_deliveries, webhook_endpoints, webhook_signing_keys
from services.kit.identities import entry
from tests.integration.creation.helpers import (
    CreationHarness,
    new_user,
    running_creation,
    user_token,
)
from tests.integration.creation.webhook_kit import eventually
from tests.support.rpc import bad_request, bearer, error_info

CREATION = "creation-credential-" + "c" * 24
OPERATOR = "operator-alice-" + "a" * 24
SHOP = "backend-shop-" + "s" * 24
FEED = "backend-feed-" + "f" * 24
URL = "https://hooks.example.com/atelier"
ALL = ["job.queued", "job.succeeded", "job.failed"]
# How far apart the test's and the statement's reading of the database's clock may be.
MARGIN = timedelta(seconds=30)

admin_pb = admin_service_pb2


def identities() -> str:
    return json.dumps(
        [
            entry("creation", "creation", (CREATION,)),
            entry("alice", "operator", (OPERATOR,)),
            entry("shop", "backend", (SHOP,), act_for_users=True, per_job_webhooks=True),
            entry("feed", "backend", (FEED,), act_for_users=True),
        ]
    )


@pytest.fixture
async def creation(creation_url: str, engine: AsyncEngine) -> AsyncIterator[CreationHarness]:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "TRUNCATE creation.webhook_deliveries, creation.webhook_endpoints,"
                " creation.webhook_signing_keys"
            )
        )
    async with running_creation(
        creation_url, SERVICE_CREDENTIAL=CREATION, SERVICE_IDENTITIES=identities()
    ) as running:
        yield running


@pytest.fixture
async def admin(
    creation: CreationHarness,
) -> AsyncIterator[admin_service_pb2_grpc.AdminServiceStub]:
    async with creation.internal_channel() as channel:
        yield admin_service_pb2_grpc.AdminServiceStub(channel)


OP = bearer(OPERATOR)


def endpoint(**fields: Any) -> webhook_pb2.WebhookEndpoint:
    return webhook_pb2.WebhookEndpoint(**{"url": URL, "event_types": ALL, **fields})


async def create(
    admin: admin_service_pb2_grpc.AdminServiceStub, **fields: Any
) -> admin_pb.CreateWebhookEndpointResponse:
    return await admin.CreateWebhookEndpoint(
        admin_pb.CreateWebhookEndpointRequest(endpoint=endpoint(**fields)), metadata=OP
    )


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    found = bad_request(error)
    return {v.field: v.description for v in found.field_violations} if found else {}


async def test_create_get_list_update_delete(
    creation: CreationHarness, admin: admin_service_pb2_grpc.AdminServiceStub
) -> None:
    made = await create(
        admin, description="feed", user_ids=["u-1"], model_ids=["stub-text"], max_in_flight=3
    )
    assert made.secret.startswith("whsec_") and len(made.secret) == len("whsec_") + 44
    shown = made.endpoint
    assert (shown.url, list(shown.event_types), shown.enabled, shown.max_in_flight) == (
        URL,
        ALL,
        True,
        3,
    )
    assert shown.created_by == "alice" and shown.create_time.seconds > 0
    got = (
        await admin.GetWebhookEndpoint(
            admin_pb.GetWebhookEndpointRequest(endpoint_id=shown.endpoint_id), metadata=OP
        )
    ).endpoint
    assert got == shown
    creation.clock.advance(1)
    second = (await create(admin)).endpoint
    creation.clock.advance(1)
    third = (await create(admin)).endpoint
    page = await admin.ListWebhookEndpoints(
        admin_pb.ListWebhookEndpointsRequest(page_size=2), metadata=OP
    )
    rest = await admin.ListWebhookEndpoints(
        admin_pb.ListWebhookEndpointsRequest(page_size=2, page_token=page.next_page_token),
        metadata=OP,
    )
    assert [e.endpoint_id for e in (*page.endpoints, *rest.endpoints)] == [
        shown.endpoint_id,
        second.endpoint_id,
        third.endpoint_id,
    ]
    assert rest.next_page_token == ""

    # Only the masked fields change; disabling says why, enabling clears it.
    changed = (
        await admin.UpdateWebhookEndpoint(
            admin_pb.UpdateWebhookEndpointRequest(
                endpoint=webhook_pb2.WebhookEndpoint(
                    endpoint_id=shown.endpoint_id,
                    url="https://other.example.com/x",
                    description="not masked",
                    enabled=False,
                ),
                update_mask=field_mask_pb2.FieldMask(paths=["url", "enabled"]),
            ),
            metadata=OP,
        )
    ).endpoint
    assert (changed.url, changed.description, changed.enabled) == (
        "https://other.example.com/x",
        "feed",
        False,
    )
    assert changed.disabled_reason == webhook_pb2.WEBHOOK_DISABLED_REASON_OPERATOR
    enabled = (
        await admin.UpdateWebhookEndpoint(
            admin_pb.UpdateWebhookEndpointRequest(
                endpoint=webhook_pb2.WebhookEndpoint(endpoint_id=shown.endpoint_id, enabled=True),
                update_mask=field_mask_pb2.FieldMask(paths=["enabled"]),
            ),
            metadata=OP,
        )
    ).endpoint
    assert enabled.enabled
    assert enabled.disabled_reason == webhook_pb2.WEBHOOK_DISABLED_REASON_UNSPECIFIED

    await admin.DeleteWebhookEndpoint(
        admin_pb.DeleteWebhookEndpointRequest(endpoint_id=shown.endpoint_id), metadata=OP
    )
    gone = await refused(
        admin.GetWebhookEndpoint(
            admin_pb.GetWebhookEndpointRequest(endpoint_id=shown.endpoint_id), metadata=OP
        )
    )
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(gone).reason == "WEBHOOK_ENDPOINT_NOT_FOUND"


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"url": "http://hooks.example.com/x"}, "endpoint.url", "https"),
        ({"url": ""}, "endpoint.url", "required"),
        ({"url": "https://user:pw@hooks.example.com/"}, "endpoint.url", "user"),
        ({"url": "https:///nohost"}, "endpoint.url", "host"),
        # An address the deliverer would refuse, named literally: refused at once.
        ({"url": "https://169.254.169.254/latest/meta-data/"}, "endpoint.url", "link-local"),
        ({"url": "https://[fd00::1]/hooks"}, "endpoint.url", "private"),
        ({"event_types": []}, "endpoint.event_types", "at least one"),
        ({"event_types": ["job.exploded"]}, "endpoint.event_types", "not one of"),
        ({"event_types": ["job.queued", "job.queued"]}, "endpoint.event_types", "once"),
        ({"max_in_flight": 1001}, "endpoint.max_in_flight", "1 to 1000"),
        ({"max_in_flight": -1}, "endpoint.max_in_flight", "1 to 1000"),
        ({"model_ids": ["Not A Model"]}, "endpoint.model_ids", "catalog"),
        ({"user_ids": ["x" * 200]}, "endpoint.user_ids", ""),
        ({"description": "d" * 501}, "endpoint.description", "500"),
    ],
)
async def test_create_refuses_bad_fields(
    admin: admin_service_pb2_grpc.AdminServiceStub,
    fields: dict[str, Any],
    field: str,
    words: str,
) -> None:
    error = await refused(create(admin, **fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(error).reason == "INVALID_ADMIN_REQUEST"
    found = violations(error)
    assert field in found and words in found[field], found


async def test_bad_ids_masks_and_unknown_endpoints(
    admin: admin_service_pb2_grpc.AdminServiceStub,
) -> None:
    error = await refused(
        admin.GetWebhookEndpoint(admin_pb.GetWebhookEndpointRequest(endpoint_id="x"), metadata=OP)
    )
    assert (error.code(), violations(error)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        {"endpoint_id": "must be a UUID"},
    )
    unknown = "11111111-2222-4333-8444-555555555555"
    for call in (
        admin.GetWebhookEndpoint(
            admin_pb.GetWebhookEndpointRequest(endpoint_id=unknown), metadata=OP
        ),
        admin.DeleteWebhookEndpoint(
            admin_pb.DeleteWebhookEndpointRequest(endpoint_id=unknown), metadata=OP
        ),
        admin.SendTestWebhook(admin_pb.SendTestWebhookRequest(endpoint_id=unknown), metadata=OP),
        admin.RotateWebhookSecret(
            admin_pb.RotateWebhookSecretRequest(endpoint_id=unknown), metadata=OP
        ),
        admin.ListWebhookDeliveries(
            admin_pb.ListWebhookDeliveriesRequest(endpoint_id=unknown), metadata=OP
        ),
    ):
        error = await refused(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(error).reason == "WEBHOOK_ENDPOINT_NOT_FOUND"
    error = await refused(
        admin.RedeliverWebhooks(
            admin_pb.RedeliverWebhooksRequest(delivery_id=999999, reason="INC-1"), metadata=OP
        )
    )
    assert error_info(error).reason == "WEBHOOK_DELIVERY_NOT_FOUND"
    made = (await create(admin)).endpoint
    for mask, words in ((["secret"], "may name only"), ([], "at least one")):
        error = await refused(
            admin.UpdateWebhookEndpoint(
                admin_pb.UpdateWebhookEndpointRequest(
                    endpoint=webhook_pb2.WebhookEndpoint(endpoint_id=made.endpoint_id),
                    update_mask=field_mask_pb2.FieldMask(paths=mask),
                ),
                metadata=OP,
            )
        )
        assert words in violations(error)["update_mask"]
    error = await refused(
        admin.UpdateWebhookEndpoint(
            admin_pb.UpdateWebhookEndpointRequest(
                endpoint=webhook_pb2.WebhookEndpoint(endpoint_id=made.endpoint_id, url="ftp://x"),
                update_mask=field_mask_pb2.FieldMask(paths=["url"]),
            ),
            metadata=OP,
        )
    )
    assert "endpoint.url" in violations(error)
    error = await refused(
        admin.RedeliverWebhooks(
            admin_pb.RedeliverWebhooksRequest(endpoint_id=made.endpoint_id, reason="INC-1"),
            metadata=OP,
        )
    )
    assert violations(error) == {"since": "is required with endpoint_id"}
    # A redelivery says why: no reason, a blank one, one too long, a control character.
    for reason, words in (
        ("", "is required"),
        ("   ", "is required"),
        ("x" * 501, "at most 500"),
        ("a\x00b", "control characters"),
    ):
        error = await refused(
            admin.RedeliverWebhooks(
                admin_pb.RedeliverWebhooksRequest(delivery_id=1, reason=reason), metadata=OP
            )
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(error).reason == "INVALID_ADMIN_REQUEST"
        assert words in violations(error)["reason"], reason
    error = await refused(
        admin.RotateWebhookSecret(
            admin_pb.RotateWebhookSecretRequest(
                endpoint_id=made.endpoint_id, overlap=duration_pb2.Duration(seconds=8 * 86400)
            ),
            metadata=OP,
        )
    )
    assert "overlap" in violations(error)
    error = await refused(
        admin.RotateWebhookSecret(
            admin_pb.RotateWebhookSecretRequest(signing_owner="feed"), metadata=OP
        )
    )
    assert "signing_owner" in violations(error)
    error = await refused(
        admin.ListWebhookDeliveries(admin_pb.ListWebhookDeliveriesRequest(), metadata=OP)
    )
    assert "parent" in violations(error)


async def test_only_operators_may_call(admin: admin_service_pb2_grpc.AdminServiceStub) -> None:
    for credential in (SHOP, FEED):
        error = await refused(
            admin.CreateWebhookEndpoint(
                admin_pb.CreateWebhookEndpointRequest(endpoint=endpoint()),
                metadata=bearer(credential),
            )
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_info(error).reason == "RPC_NOT_PERMITTED"
    error = await refused(
        admin.ListWebhookEndpoints(admin_pb.ListWebhookEndpointsRequest(), metadata=bearer(SHOP))
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_secrets_are_shown_by_create_and_rotate_only_and_never_logged(
    admin: admin_service_pb2_grpc.AdminServiceStub,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    made = await create(admin)
    endpoint_id = made.endpoint.endpoint_id
    got = await admin.GetWebhookEndpoint(
        admin_pb.GetWebhookEndpointRequest(endpoint_id=endpoint_id), metadata=OP
    )
    listed = await admin.ListWebhookEndpoints(admin_pb.ListWebhookEndpointsRequest(), metadata=OP)
    rotated = await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(
            endpoint_id=endpoint_id, overlap=duration_pb2.Duration(seconds=3600)
        ),
        metadata=OP,
    )
    key = await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(signing_owner="shop"), metadata=OP
    )
    secrets = {made.secret, rotated.secret, key.secret}
    assert len(secrets) == 3 and all(s.startswith("whsec_") for s in secrets)
    for answer in (got, listed):
        assert not any(s in answer.SerializeToString().decode(errors="replace") for s in secrets)
    # The previous secret signs until the overlap ends; the store holds both.
    async with engine.connect() as connection:
        db_now = (await connection.execute(select(func.now()))).scalar_one()
        row = (
            await connection.execute(
                select(webhook_endpoints).where(webhook_endpoints.c.endpoint_id == endpoint_id)
            )
        ).one()
        owner = (
            await connection.execute(
                select(webhook_signing_keys).where(webhook_signing_keys.c.owner == "shop")
            )
        ).one()
    assert (row.secret, row.previous_secret) == (rotated.secret, made.secret)
    # On the database's clock, the deliverer's.
    assert abs(row.previous_secret_expires_at - (db_now + timedelta(seconds=3600))) < MARGIN
    assert (
        rotated.previous_secret_expire_time.ToDatetime(tzinfo=row.updated_at.tzinfo)
        == row.previous_secret_expires_at
    )
    assert (owner.secret, owner.previous_secret) == (key.secret, None)
    assert not key.HasField("previous_secret_expire_time")
    # A second rotation of the key keeps the first for the default overlap (a day).
    again = await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(signing_owner="shop"), metadata=OP
    )
    async with engine.connect() as connection:
        owner = (
            await connection.execute(
                select(webhook_signing_keys).where(webhook_signing_keys.c.owner == "shop")
            )
        ).one()
    assert (owner.secret, owner.previous_secret) == (again.secret, key.secret)
    assert abs(owner.previous_secret_expires_at - (db_now + timedelta(days=1))) < MARGIN
    got = await admin.GetWebhookEndpoint(
        admin_pb.GetWebhookEndpointRequest(endpoint_id=endpoint_id), metadata=OP
    )
    assert got.endpoint.HasField("previous_secret_expire_time")
    logged = "\n".join(f"{r.getMessage()} {getattr(r, 'fields', {})}" for r in caplog.records)
    assert "webhook_secret_rotated" in logged and "webhook_signing_key_rotated" in logged
    assert "'operator': 'alice'" in logged
    for secret in (*secrets, again.secret):
        assert secret not in logged and secret.removeprefix("whsec_") not in logged


async def test_test_event_delivery_log_and_redelivery(
    admin: admin_service_pb2_grpc.AdminServiceStub,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    made = (await create(admin)).endpoint
    other = (await create(admin)).endpoint
    # Disabled, so the deliverer (every role runs one) leaves their deliveries alone: a
    # test event to a disabled endpoint waits until it is enabled again.
    for endpoint_id in (made.endpoint_id, other.endpoint_id):
        await admin.UpdateWebhookEndpoint(
            admin_pb.UpdateWebhookEndpointRequest(
                endpoint=webhook_pb2.WebhookEndpoint(endpoint_id=endpoint_id, enabled=False),
                update_mask=field_mask_pb2.FieldMask(paths=["enabled"]),
            ),
            metadata=OP,
        )
    first = (
        await admin.SendTestWebhook(
            admin_pb.SendTestWebhookRequest(endpoint_id=made.endpoint_id), metadata=OP
        )
    ).delivery
    assert (first.event_type, first.job_version, first.endpoint_id) == (
        "webhook.test",
        0,
        made.endpoint_id,
    )
    assert first.message_id.startswith("msg_")
    assert first.state == webhook_pb2.WEBHOOK_DELIVERY_STATE_PENDING
    assert first.HasField("next_attempt_time")
    second = (
        await admin.SendTestWebhook(
            admin_pb.SendTestWebhookRequest(endpoint_id=made.endpoint_id), metadata=OP
        )
    ).delivery
    await admin.SendTestWebhook(
        admin_pb.SendTestWebhookRequest(endpoint_id=other.endpoint_id), metadata=OP
    )
    async with engine.begin() as connection:
        payload = (
            await connection.execute(
                select(webhook_deliveries.c.payload).where(
                    webhook_deliveries.c.delivery_id == first.delivery_id
                )
            )
        ).scalar_one()
        # Both as a deliverer would leave them after giving up.
        await connection.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.endpoint_id == made.endpoint_id)
            .values(
                state="failed",
                attempts=9,
                last_status_code=503,
                last_error="503 Service Unavailable",
                last_response_excerpt="busy",
                completed_at=text("now()"),
                # As a deliverer's claim would: a redelivery drops it (so an attempt still
                # in flight records nothing over the redelivery).
                claimed_until=text("now() + interval '1 minute'"),
            )
        )
    assert payload["status"] == "JOB_STATUS_SUCCEEDED" and payload["jobId"]

    page = await admin.ListWebhookDeliveries(
        admin_pb.ListWebhookDeliveriesRequest(endpoint_id=made.endpoint_id, page_size=1),
        metadata=OP,
    )
    rest = await admin.ListWebhookDeliveries(
        admin_pb.ListWebhookDeliveriesRequest(
            endpoint_id=made.endpoint_id, page_size=1, page_token=page.next_page_token
        ),
        metadata=OP,
    )
    listed = [*page.deliveries, *rest.deliveries]
    assert [d.delivery_id for d in listed] == [second.delivery_id, first.delivery_id]
    shown = listed[1]
    assert (shown.state, shown.attempts, shown.last_status_code, shown.last_error) == (
        webhook_pb2.WEBHOOK_DELIVERY_STATE_FAILED,
        9,
        503,
        "503 Service Unavailable",
    )
    assert shown.last_response_excerpt == "busy" and not shown.HasField("next_attempt_time")
    assert shown.HasField("complete_time")
    pending = await admin.ListWebhookDeliveries(
        admin_pb.ListWebhookDeliveriesRequest(
            endpoint_id=made.endpoint_id, state=webhook_pb2.WEBHOOK_DELIVERY_STATE_PENDING
        ),
        metadata=OP,
    )
    assert list(pending.deliveries) == []

    # One delivery: back to pending, due now, attempts and message id kept.
    count = await admin.RedeliverWebhooks(
        admin_pb.RedeliverWebhooksRequest(
            delivery_id=first.delivery_id, reason="INC-2: endpoint fixed"
        ),
        metadata=OP,
    )
    assert count.redelivered_count == 1
    # Every failed one of the endpoint since a time: only the other is left failed.
    since = timestamp_pb2.Timestamp()
    since.FromDatetime(shown.create_time.ToDatetime() - timedelta(minutes=1))
    count = await admin.RedeliverWebhooks(
        admin_pb.RedeliverWebhooksRequest(
            endpoint_id=made.endpoint_id, since=since, reason="INC-2: all of them"
        ),
        metadata=OP,
    )
    assert count.redelivered_count == 1
    future = timestamp_pb2.Timestamp()
    future.FromDatetime(shown.create_time.ToDatetime() + timedelta(days=1))
    count = await admin.RedeliverWebhooks(
        admin_pb.RedeliverWebhooksRequest(
            endpoint_id=made.endpoint_id, since=future, reason="INC-2: none left"
        ),
        metadata=OP,
    )
    assert count.redelivered_count == 0
    # Each redelivery is recorded with who asked and why.
    redelivered = [
        getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "webhooks_redelivered"
    ]
    assert [(f.get("operator"), f.get("reason"), f.get("count")) for f in redelivered] == [
        ("alice", "INC-2: endpoint fixed", 1),
        ("alice", "INC-2: all of them", 1),
        ("alice", "INC-2: none left", 0),
    ]
    async with engine.connect() as connection:
        rows = (
            await connection.execute(
                select(webhook_deliveries)
                .where(webhook_deliveries.c.endpoint_id == made.endpoint_id)
                .order_by(webhook_deliveries.c.delivery_id)
            )
        ).all()
    assert [r.message_id for r in rows] == [first.message_id, second.message_id]
    assert [(r.state, r.attempts, r.completed_at) for r in rows] == [("pending", 9, None)] * 2
    assert [r.claimed_until for r in rows] == [None, None]
    # Deleting the endpoint takes its log with it.
    await admin.DeleteWebhookEndpoint(
        admin_pb.DeleteWebhookEndpointRequest(endpoint_id=made.endpoint_id), metadata=OP
    )
    async with engine.connect() as connection:
        left = (
            await connection.execute(
                select(webhook_deliveries.c.endpoint_id).where(
                    webhook_deliveries.c.endpoint_id == made.endpoint_id
                )
            )
        ).all()
    assert left == []


def text_job(**fields: Any) -> creation_service_pb2.SubmitJobRequest:
    return creation_service_pb2.SubmitJobRequest(
        model_id="stub-text",
        style_id="watercolor",
        prompt="a lighthouse",
        width=512,
        height=512,
        **fields,
    )


HOOK = creation_service_pb2.JobWebhook(url="https://shop.example.com/hook")


def acting(credential: str, user: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"), ("atelier-on-behalf-of", user))


async def test_a_per_job_webhook_from_a_permitted_backend(
    creation: CreationHarness, admin: admin_service_pb2_grpc.AdminServiceStub, engine: AsyncEngine
) -> None:
    user = new_user()
    async with creation.public_channel() as channel:
        jobs = creation_service_pb2_grpc.CreationServiceStub(channel)
        # No signing key yet: refused, nothing made.
        error = await refused(
            jobs.SubmitJob(text_job(webhook=HOOK, request_id="k1"), metadata=acting(SHOP, user))
        )
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(error).reason == "WEBHOOK_SIGNING_KEY_MISSING"
        await admin.RotateWebhookSecret(
            admin_pb.RotateWebhookSecretRequest(signing_owner="shop"), metadata=OP
        )
        job = (
            await jobs.SubmitJob(
                text_job(webhook=HOOK, request_id="k1"), metadata=acting(SHOP, user)
            )
        ).job
        # A replay makes no second endpoint; another webhook under the key is another
        # request.
        replay = (
            await jobs.SubmitJob(
                text_job(webhook=HOOK, request_id="k1"), metadata=acting(SHOP, user)
            )
        ).job
        assert replay.job_id == job.job_id
        error = await refused(
            jobs.SubmitJob(
                text_job(
                    webhook=creation_service_pb2.JobWebhook(url="https://else.example.com/"),
                    request_id="k1",
                ),
                metadata=acting(SHOP, user),
            )
        )
        assert error_info(error).reason == "IDEMPOTENCY_KEY_REUSED"
        error = await refused(
            jobs.SubmitJob(
                text_job(
                    webhook=creation_service_pb2.JobWebhook(
                        url="http://shop.example.com/", event_types=["job.nope"]
                    )
                ),
                metadata=acting(SHOP, user),
            )
        )
        assert error_info(error).reason == "INVALID_JOB_REQUEST"
        assert set(violations(error)) == {"webhook.url", "webhook.event_types"}
    listed = (
        await admin.ListWebhookEndpoints(
            admin_pb.ListWebhookEndpointsRequest(job_id=job.job_id), metadata=OP
        )
    ).endpoints
    [hook] = listed
    assert (hook.url, hook.job_id, hook.signing_owner, hook.created_by) == (
        HOOK.url,
        job.job_id,
        "shop",
        "shop",
    )
    assert "job.progress" not in hook.event_types and "job.succeeded" in hook.event_types
    # The per-job endpoint is not among the registered ones.
    registered = await admin.ListWebhookEndpoints(
        admin_pb.ListWebhookEndpointsRequest(), metadata=OP
    )
    assert list(registered.endpoints) == []
    # Written before the job, so its job.queued is delivered too (once the deliverer the
    # harness runs has fanned the job's change out).
    await eventually(engine, "d.job_id = $1::uuid", 1, 30, job.job_id)
    deliveries = (
        await admin.ListWebhookDeliveries(
            admin_pb.ListWebhookDeliveriesRequest(job_id=job.job_id), metadata=OP
        )
    ).deliveries
    assert [(d.endpoint_id, d.event_type, d.job_version) for d in deliveries][-1] == (
        hook.endpoint_id,
        "job.queued",
        1,
    )
    # A per-job endpoint's secret is its owner's key: no rotation of its own.
    error = await refused(
        admin.RotateWebhookSecret(
            admin_pb.RotateWebhookSecretRequest(endpoint_id=hook.endpoint_id), metadata=OP
        )
    )
    assert "endpoint_id" in violations(error)


async def test_a_per_job_webhook_is_refused_for_users_and_unpermitted_backends(
    creation: CreationHarness, admin: admin_service_pb2_grpc.AdminServiceStub, engine: AsyncEngine
) -> None:
    user = new_user()
    await admin.RotateWebhookSecret(
        admin_pb.RotateWebhookSecretRequest(signing_owner="shop"), metadata=OP
    )
    async with creation.public_channel() as channel:
        jobs = creation_service_pb2_grpc.CreationServiceStub(channel)
        for metadata in (user_token(user), acting(FEED, user)):
            error = await refused(jobs.SubmitJob(text_job(webhook=HOOK), metadata=metadata))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(error).reason == "WEBHOOK_NOT_PERMITTED"
        # Without the field the same callers submit as before.
        await jobs.SubmitJob(text_job(), metadata=user_token(user))
    async with engine.connect() as connection:
        count = (
            await connection.execute(text("SELECT count(*) FROM creation.webhook_endpoints"))
        ).scalar_one()
    assert count == 0
