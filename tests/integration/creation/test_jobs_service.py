"""creation's service layer through its real listeners, with a real media service beside
it (its own database, local storage): the submit flow and its input-asset rules, replay,
cancel, operators' decisions and grants — and the domain log line each one writes, with
ids as fields and never a token."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    job_pb2,
)
from atelier.media.v1 import (
    asset_pb2,
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from tests.integration.creation.helpers import (
    SERVICE,
    CreationHarness,
    new_user,
    running_creation,
    user_token,
)
from tests.support.fenced import fenced_write
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media
from tests.support.rpc import error_info

TTL = timedelta(seconds=30)


@dataclass
class Stack:
    creation: CreationHarness
    media: MediaHarness


@pytest.fixture
async def stack(creation_url: str, media_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_media(media_settings(media_url, tmp_path)) as media:
        address = f"127.0.0.1:{media.running.internal_port}"
        async with running_creation(creation_url, media_address=address) as creation:
            yield Stack(creation, media)


async def put_asset(
    media: MediaHarness, owner: str, purpose: int = asset_pb2.ASSET_PURPOSE_AI_INPUT
) -> str:
    data = image_bytes("PNG")

    async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner, purpose=purpose, content_type="image/png"
            )
        )
        yield media_internal_service_pb2.PutAssetRequest(chunk=data)

    async with media.internal_channel() as channel:
        stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
        reply = await stub.PutAsset(parts(), metadata=SERVICE)
    return str(reply.asset.asset_id)


async def uploading_asset(media: MediaHarness, owner: str) -> str:
    async with media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        reply = await stub.CreateUpload(
            media_service_pb2.CreateUploadRequest(
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT, content_type="image/png", size_bytes=100
            ),
            metadata=user_token(owner),
        )
    return str(reply.asset.asset_id)


def request(asset_id: str, key: str = "") -> creation_service_pb2.SubmitJobRequest:
    return creation_service_pb2.SubmitJobRequest(
        request_id=key,
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id=asset_id,
        prompt="a cat",
        width=512,
        height=512,
    )


def logged(
    caplog: pytest.LogCaptureFixture, action: str, level: int = logging.INFO
) -> list[dict[str, Any]]:
    return [
        dict(getattr(r, "fields", {}))
        for r in caplog.records
        if r.getMessage() == action
        and r.name.startswith("services.creation")
        and r.levelno == level
    ]


async def test_submit_replay_and_cancel_log_their_actions(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    # A new job's line is DEBUG (its first job event is the record); the rest are INFO.
    caplog.set_level(logging.DEBUG)
    submitted_before = REGISTRY.get_sample_value("atelier_jobs_submitted_total") or 0.0
    user = new_user()
    asset = await put_asset(stack.media, user)
    credentials = user_token(user)
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        first = await stub.SubmitJob(request(asset, "k-1"), metadata=credentials)
        again = await stub.SubmitJob(request(asset, "k-1"), metadata=credentials)
        assert again.job.job_id == first.job.job_id
        cancel = creation_service_pb2.CancelJobRequest(job_id=first.job.job_id)
        cancelled = await stub.CancelJob(cancel, metadata=credentials)
        await stub.CancelJob(cancel, metadata=credentials)  # changes nothing, says nothing
    assert cancelled.job.status == job_pb2.JOB_STATUS_CANCELLED
    job_id = first.job.job_id
    # Counted once: the replay created no job.
    assert REGISTRY.get_sample_value("atelier_jobs_submitted_total") == submitted_before + 1
    assert logged(caplog, "job_submitted", logging.DEBUG) == [
        {
            "job_id": job_id,
            "user_id": user,
            "model_id": "stub-fast",
            "style_id": "watercolor",
            "price_points": 5,
        }
    ]
    assert logged(caplog, "job_submit_replayed") == [{"job_id": job_id, "user_id": user}]
    assert logged(caplog, "job_cancelled") == [{"job_id": job_id, "user_id": user, "version": 2}]
    token = credentials[0][1].split()[-1]
    assert all(token not in record.getMessage() + str(record.__dict__) for record in caplog.records)


@pytest.mark.parametrize(
    ("whose", "purpose", "code", "reason"),
    [
        ("stranger", asset_pb2.ASSET_PURPOSE_AI_INPUT, "NOT_FOUND", "INPUT_ASSET_NOT_FOUND"),
        (
            "owner",
            asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
            "INVALID_ARGUMENT",
            "INPUT_ASSET_WRONG_PURPOSE",
        ),
        ("owner", None, "FAILED_PRECONDITION", "INPUT_ASSET_NOT_READY"),
    ],
)
async def test_the_input_asset_rules(
    stack: Stack, engine: AsyncEngine, whose: str, purpose: int | None, code: str, reason: str
) -> None:
    owner = new_user()
    if purpose is None:
        asset = await uploading_asset(stack.media, owner)
    else:
        asset = await put_asset(stack.media, owner if whose == "owner" else new_user(), purpose)
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(request(asset), metadata=user_token(owner))
        listed = await stub.ListJobs(
            creation_service_pb2.ListJobsRequest(), metadata=user_token(owner)
        )
    assert caught.value.code().name == code
    assert error_info(caught.value).reason == reason
    assert list(listed.jobs) == []


async def test_operator_actions_log_their_actions(
    stack: Stack, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    user = new_user()
    asset = await put_asset(stack.media, user)
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await stub.SubmitJob(request(asset), metadata=user_token(user))).job
    now = stack.creation.clock()
    (claimed,) = await leases.claim(engine, "w", 10, TTL, now)
    await fenced_write(
        engine, FencedWrite.MARK_SUBMITTING, claimed.job_id, claimed.lease_epoch, now
    )
    [r.job for r in await leases.reap_decided(engine, now + TTL * 2, 10)]
    async with stack.creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        await admin.ResolveJob(
            admin_service_pb2.ResolveJobRequest(
                job_id=job.job_id,
                resolution=admin_service_pb2.RESOLUTION_FAIL,
                operator="ops@atelier",
                reason="provider says it never ran",
            ),
            metadata=SERVICE,
        )
        await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user, amount=10, request_id="sorry-1", reason="apology"
            ),
            metadata=SERVICE,
        )
        await admin.GrantPoints(
            admin_service_pb2.GrantPointsRequest(
                user_id=user, amount=10, request_id="sorry-1", reason="apology"
            ),
            metadata=SERVICE,
        )
    assert logged(caplog, "job_resolved") == [
        {
            "job_id": job.job_id,
            "decision": "fail",
            "operator": "ops@atelier",
            "status": "failed",
            "version": 5,
        }
    ]
    # 100 welcome, the failed job's 5 released, 10 granted.
    granted = {
        "user_id": user,
        "amount": 10,
        "request_id": "sorry-1",
        "available_points": 110,
        "granted_by": "",
    }
    assert logged(caplog, "points_granted") == [granted]
    assert logged(caplog, "points_grant_replayed") == [granted]


async def test_media_refuses_an_overlong_subject_at_authentication(stack: Stack) -> None:
    # Once an INTERNAL from media's owner CHECK; now the kit's principal-id rule answers.
    async with stack.media.public_channel() as channel:
        stub = media_service_pb2_grpc.MediaServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateUpload(
                media_service_pb2.CreateUploadRequest(
                    purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                    content_type="image/png",
                    size_bytes=100,
                ),
                metadata=user_token("u" * 300),
            )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(caught.value).reason == "TOKEN_INVALID"


async def test_a_client_stream_part_that_does_not_parse_is_malformed_request(
    stack: Stack,
) -> None:
    # media's PutAsset: a good header, then a part whose bytes end inside a field.
    header = media_internal_service_pb2.PutAssetRequest(
        header=media_internal_service_pb2.PutAssetHeader(
            owner_user_id="alice",
            purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
            content_type="image/png",
        )
    ).SerializeToString()

    async def parts() -> AsyncIterator[bytes]:
        yield header
        yield b"\x12\x05\xff"

    async with stack.media.internal_channel() as channel:
        put = channel.stream_unary(
            "/atelier.media.v1.MediaInternalService/PutAsset",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await put(parts(), metadata=SERVICE)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "MALFORMED_REQUEST"
