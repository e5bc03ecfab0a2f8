"""One credential per calling identity, over real listeners: creation and media each run
with ATELIER_SERVICE_IDENTITIES (and without the shared token: prod-like), creation calls
media with its own credential, an operator's credential is refused at media, both
credentials of a rotation work and a removed one is refused, and a job's event names
the operator who resolved it."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2_grpc,
    job_pb2,
)
from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
)
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.creation.tables import points_ledger
from services.kit.identities import entry
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.integration.creation.helpers import (
    CreationHarness,
    new_user,
    running_creation,
    user_token,
)
from tests.integration.creation.test_jobs_service import request
from tests.support.fenced import fenced_write
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media
from tests.support.rpc import bearer, error_info

CREATION = "creation-credential-" + "c" * 24
CREATION_NEXT = "creation-credential-next-" + "n" * 24
OPERATOR = "operator-alice-" + "a" * 24
BACKEND = "backend-shop-" + "b" * 24
TTL = timedelta(seconds=30)
PUT_ASSET = "/atelier.media.v1.MediaInternalService/PutAsset"


def identities(*creation_credentials: str) -> str:
    return json.dumps(
        [
            entry("creation", "creation", creation_credentials),
            entry("alice", "operator", (OPERATOR,)),
            entry("shop", "backend", (BACKEND,), act_for_users=True),
        ]
    )


def settings_for(value: str) -> dict[str, str]:
    # ATELIER_SERVICE_TOKEN unset: with identities the shared token is off.
    return {"SERVICE_IDENTITIES": value}


@dataclass
class Stack:
    creation: CreationHarness
    media: MediaHarness


@pytest.fixture
async def stack(creation_url: str, media_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    value = identities(CREATION, CREATION_NEXT)
    async with running_media(media_settings(media_url, tmp_path, **settings_for(value))) as media:
        address = f"127.0.0.1:{media.running.internal_port}"
        async with running_creation(
            creation_url, media_address=address, SERVICE_CREDENTIAL=CREATION, **settings_for(value)
        ) as creation:
            yield Stack(creation, media)


async def put_asset(media: MediaHarness, owner: str, credential: str) -> str:
    data = image_bytes("PNG")

    async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner,
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                content_type="image/png",
            )
        )
        yield media_internal_service_pb2.PutAssetRequest(chunk=data)

    async with media.internal_channel() as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.PutAsset(parts(), metadata=bearer(credential))
    return str(reply.asset.asset_id)


async def refusal(media: MediaHarness, credential: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await put_asset(media, new_user(), credential)
    return refused.value


async def test_creation_may_put_assets_and_an_operator_may_not(stack: Stack) -> None:
    assert await put_asset(stack.media, new_user(), CREATION)
    refused = await refusal(stack.media, OPERATOR)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    info = error_info(refused)
    assert info.reason == "RPC_NOT_PERMITTED"
    assert dict(info.metadata) == {"identity": "alice", "method": PUT_ASSET}
    assert OPERATOR not in (refused.details() or "")
    # Nor does the shared development token pass once identities are set.
    shared = await refusal(stack.media, DEV_SERVICE_TOKEN)
    assert shared.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(shared).reason == "SERVICE_CREDENTIAL_INVALID"


async def test_both_credentials_of_a_rotation_work_and_a_removed_one_is_refused(
    media_url: str, tmp_path: Path
) -> None:
    both = media_settings(media_url, tmp_path, **settings_for(identities(CREATION, CREATION_NEXT)))
    async with running_media(both) as media:
        assert await put_asset(media, new_user(), CREATION)
        assert await put_asset(media, new_user(), CREATION_NEXT)
    # The rotation's end: the old credential's hash is removed and media restarted.
    rotated = media_settings(media_url, tmp_path, **settings_for(identities(CREATION_NEXT)))
    async with running_media(rotated) as media:
        assert await put_asset(media, new_user(), CREATION_NEXT)
        refused = await refusal(media, CREATION)
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(refused).reason == "SERVICE_CREDENTIAL_INVALID"


async def test_the_event_of_a_resolution_names_the_operator_identity(
    stack: Stack, engine: AsyncEngine
) -> None:
    user = new_user()
    asset = await put_asset(stack.media, user, CREATION)
    # SubmitJob asks media about the input with creation's own credential.
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await stub.SubmitJob(request(asset), metadata=user_token(user))).job
    now = stack.creation.clock()
    (claimed,) = await leases.claim(engine, "w", 10, TTL, now)
    await fenced_write(
        engine, FencedWrite.MARK_SUBMITTING, claimed.job_id, claimed.lease_epoch, now
    )
    await leases.reap_decided(engine, now + TTL * 2, 10)
    async with stack.creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        resolve = admin_service_pb2.ResolveJobRequest(
            job_id=job.job_id,
            resolution=admin_service_pb2.RESOLUTION_FAIL,
            reason="provider says it never ran",
        )
        # creation's own credential may not act as an operator.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin.ResolveJob(resolve, metadata=bearer(CREATION))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Nor may an operator sign the decision with another's name.
        resolve.operator = "bob"
        with pytest.raises(grpc.aio.AioRpcError) as impostor:
            await admin.ResolveJob(resolve, metadata=bearer(OPERATOR))
        assert impostor.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        resolve.operator = ""
        await admin.ResolveJob(resolve, metadata=bearer(OPERATOR))
        events = (
            await admin.ListJobEvents(
                admin_service_pb2.ListJobEventsRequest(job_id=job.job_id),
                metadata=bearer(OPERATOR),
            )
        ).events
    last = events[-1]
    assert last.to_status == job_pb2.JOB_STATUS_FAILED
    assert (last.actor_kind, last.actor_id) == (job_pb2.ACTOR_KIND_OPERATOR, "alice")


async def test_a_grant_names_the_operator_identity(stack: Stack, engine: AsyncEngine) -> None:
    user = new_user()
    async with stack.creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user, amount=10, request_id="sorry-1", reason="apology"
            ),
            metadata=bearer(OPERATOR),
        )
    async with engine.connect() as connection:
        entries = (
            await connection.execute(
                select(points_ledger.c.grant_key, points_ledger.c.granted_by)
                .where(points_ledger.c.user_id == user)
                .order_by(points_ledger.c.entry_id)
            )
        ).all()
    # The operator's grant names them; the welcome that came with it names nobody.
    assert [tuple(e) for e in entries] == [("operator:sorry-1", "alice"), ("welcome", None)]


async def test_a_backend_acting_for_a_user_is_logged_and_recorded(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # job_submitted is a DEBUG line
    user = new_user()
    asset = await put_asset(stack.media, user, CREATION)
    acting = (("authorization", f"Bearer {BACKEND}"), ("atelier-on-behalf-of", user))
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await stub.SubmitJob(request(asset), metadata=acting)).job
    assert job.user_id == user
    [line] = [
        dict(getattr(r, "fields", {}))
        for r in caplog.records
        if r.getMessage() == "job_submitted"
        and getattr(r, "fields", {}).get("job_id") == job.job_id
    ]
    assert (line["user_id"], line["via"]) == (user, "shop")
    async with stack.creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        (event,) = (
            await admin.ListJobEvents(
                admin_service_pb2.ListJobEventsRequest(job_id=job.job_id),
                metadata=bearer(OPERATOR),
            )
        ).events
    assert (event.actor_kind, event.actor_id, event.via) == (job_pb2.ACTOR_KIND_USER, user, "shop")
