"""Hostile input through creation's real listeners (grpc.aio server, the kit's
interceptors, real PostgreSQL): each probe that once broke the service is now a clean
INVALID_ARGUMENT or UNAUTHENTICATED with a stable reason, never INTERNAL or UNKNOWN."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import jwt
import pytest
from google.protobuf import timestamp_pb2
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    parameters_pb2,
)
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.kit.settings import DEV_JWT_SECRET
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
from tests.support.fenced import fenced_write
from tests.support.rpc import bad_request, bearer, error_info

TTL = timedelta(seconds=30)


@pytest.fixture
async def creation(creation_url: str) -> AsyncIterator[CreationHarness]:
    async with running_creation(creation_url) as harness:
        yield harness


def submit_request(**parameters: float) -> creation_service_pb2.SubmitJobRequest:
    return creation_service_pb2.SubmitJobRequest(
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id="3f2504e0-4f89-41d3-9a0c-0305e82c3301",
        prompt="a cat",
        width=512,
        height=512,
        parameters={
            name: parameters_pb2.ParameterValue(float_value=value)
            for name, value in parameters.items()
        },
    )


def assert_invalid(error: grpc.aio.AioRpcError, reason: str, field: str) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error_info(error).reason == reason
    violations = bad_request(error)
    assert violations is not None
    assert field in [v.field for v in violations.field_violations]


# --- 1. parameters that JSON cannot hold --------------------------------------------


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf")])
async def test_a_non_finite_parameter_is_a_field_violation(
    creation: CreationHarness, engine: AsyncEngine, scale: float
) -> None:
    user = new_user()
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(submit_request(guidance_scale=scale), metadata=user_token(user))
        assert_invalid(caught.value, "INVALID_JOB_REQUEST", "parameters.guidance_scale")
        listed = await stub.ListJobs(
            creation_service_pb2.ListJobsRequest(), metadata=user_token(user)
        )
    assert list(listed.jobs) == []


# --- 2. bytes that are not the request message --------------------------------------

# Field 3 (style_id, a string) holding bytes that are not UTF-8; and a truncated varint.
BAD_UTF8 = b"\x12\x09stub-fast\x1a\x02\xff\xfe"
TRUNCATED = b"\x38\xff\xff"


def raw_call(channel: grpc.aio.Channel, method: str) -> Any:
    # No serializers: the bytes go out exactly as given.
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


@pytest.mark.parametrize("payload", [BAD_UTF8, TRUNCATED])
async def test_bytes_that_do_not_parse_are_malformed_request(
    creation: CreationHarness, payload: bytes
) -> None:
    async with creation.public_channel() as channel:
        submit = raw_call(channel, "/atelier.creation.v1.CreationService/SubmitJob")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(payload, metadata=user_token(new_user()))
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(error).reason == "MALFORMED_REQUEST"
    for internal_name in ("DecodeError", "Error", "class", "google.protobuf", "Traceback"):
        assert internal_name not in (error.details() or "")


async def test_authentication_comes_before_parsing(creation: CreationHarness) -> None:
    async with creation.public_channel() as channel:
        submit = raw_call(channel, "/atelier.creation.v1.CreationService/SubmitJob")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(BAD_UTF8)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(caught.value).reason == "TOKEN_MISSING"


async def test_every_listener_and_method_answers_malformed_request(
    creation: CreationHarness,
) -> None:
    async with creation.internal_channel() as channel:
        grant = raw_call(channel, "/atelier.creation.v1.AdminService/GrantPoints")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await grant(b"\x0a\x01\xc0", metadata=SERVICE)
        assert error_info(caught.value).reason == "MALFORMED_REQUEST"
        # Health needs no credential; it too answers a clean error.
        check = raw_call(channel, "/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(b"\x0a\x01\xc0")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "MALFORMED_REQUEST"


async def test_a_server_stream_answers_malformed_request(creation: CreationHarness) -> None:
    async with creation.public_channel() as channel:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in watch(b"\x0a\x01\xc0"):
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "MALFORMED_REQUEST"


async def test_a_client_stream_answers_malformed_request(creation: CreationHarness) -> None:
    # Reflection reads a stream of requests: the second one does not parse.
    good = b"\x3a\x00"  # list_services = ""
    async with creation.public_channel() as channel:
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=None,
            response_deserializer=None,
        )
        call = reflect()
        await call.write(good)
        assert await call.read()  # the list of services: the stream works
        await call.write(b"\x3a\x01\xc0")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "MALFORMED_REQUEST"


# --- 4. page tokens -----------------------------------------------------------------


def forged(body: Any) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def jobs_token(**fields: Any) -> str:
    body = {
        "_list": "jobs",
        "_binding": "",
        "created_at": "2026-11-30T12:00:00+00:00",
        "job_id": "3f2504e0-4f89-41d3-9a0c-0305e82c3301",
    }
    body.update(fields)
    return forged(body)


FORGED_JOB_TOKENS = {
    "earliest time east of UTC": jobs_token(created_at="0001-01-01T00:00:00+14:00"),
    "latest time west of UTC": jobs_token(created_at="9999-12-31T23:59:59-14:00"),
    "naive time": jobs_token(created_at="2026-11-30T12:00:00"),
    "not a time": jobs_token(created_at="yesterday"),
    "time as a number": jobs_token(created_at=1700000000),
    "job id not a UUID": jobs_token(job_id="x' OR 1=1 --"),
    "job id a number": jobs_token(job_id=7),
    "another list's token": jobs_token(_list="attention_jobs"),
    "an extra field": jobs_token(more=1),
    "a missing field": forged({"_list": "jobs", "_binding": "", "job_id": "x"}),
    "deeply nested JSON": forged(b"[" * 100_000 + b"]" * 100_000),
    "nested JSON within the length limit": forged(b"[" * 190 + b"]" * 190),
    "a JSON list": forged([1, 2]),
    "not base64": "!!!",
    "not JSON": forged(b"\xff\xfe"),
    "the old format": forged({"t": "2026-11-30T12:00:00+00:00", "j": "x", "s": ""}),
}


@pytest.mark.parametrize("token", FORGED_JOB_TOKENS.values(), ids=FORGED_JOB_TOKENS.keys())
async def test_a_forged_list_jobs_token_is_invalid_page_token(
    creation: CreationHarness, token: str
) -> None:
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListJobs(
                creation_service_pb2.ListJobsRequest(page_token=token),
                metadata=user_token(new_user()),
            )
    assert_invalid(caught.value, "INVALID_PAGE_TOKEN", "page_token")


async def test_list_jobs_pages_and_binds_the_filter(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    made = [
        (await store.submit(engine, user, command(), LIMITS, T0 + timedelta(seconds=i))).job.job_id
        for i in range(5)
    ]
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        seen: list[str] = []
        token = ""
        while True:
            page = await stub.ListJobs(
                creation_service_pb2.ListJobsRequest(page_size=2, page_token=token),
                metadata=user_token(user),
            )
            seen.extend(job.job_id for job in page.jobs)
            token = page.next_page_token
            if not token:
                break
            last_token = token
        assert seen == list(reversed(made))
        # A token is only good for the filter it was issued for.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListJobs(
                creation_service_pb2.ListJobsRequest(page_token=last_token, statuses=[2]),
                metadata=user_token(user),
            )
        assert_invalid(caught.value, "INVALID_PAGE_TOKEN", "page_token")
        # A status number no version of the contract has, a time no calendar holds.
        for request, field in (
            (creation_service_pb2.ListJobsRequest(statuses=[1, 99]), "statuses[1]"),
            (
                creation_service_pb2.ListJobsRequest(
                    create_time_after=timestamp_pb2.Timestamp(seconds=2**62)
                ),
                "create_time_after",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListJobs(request, metadata=user_token(user))
            assert_invalid(caught.value, "INVALID_JOB_FILTER", field)


async def needs_attention(engine: AsyncEngine) -> str:
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    (claimed,) = await leases.claim(engine, "w", 10, TTL, T0)
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, claimed.job_id, claimed.lease_epoch, T0)
    (reaped,) = [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 10)]
    assert reaped.job_id == job.job_id
    return job.job_id


def attention_token(**fields: Any) -> str:
    body = {
        "_list": "attention_jobs",
        "_binding": "",
        "updated_at": "2026-11-30T12:00:00+00:00",
        "job_id": "3f2504e0-4f89-41d3-9a0c-0305e82c3301",
    }
    body.update(fields)
    return forged(body)


@pytest.mark.parametrize(
    "token",
    [
        attention_token(job_id="not-a-uuid"),
        attention_token(updated_at="0001-01-01T00:00:00+14:00"),
        attention_token(updated_at="9999-12-31T23:59:59-14:00"),
        # The old cursor's name for this field, which held updated_at under another name.
        attention_token(created_at="2026-11-30T12:00:00+00:00"),
        jobs_token(),
        forged({"t": "2026-11-30T12:00:00+00:00", "j": "not-a-uuid"}),
    ],
)
async def test_a_forged_attention_token_is_invalid_page_token(
    creation: CreationHarness, token: str
) -> None:
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin.ListAttentionJobs(
                admin_service_pb2.ListAttentionJobsRequest(page_token=token), metadata=SERVICE
            )
    assert_invalid(caught.value, "INVALID_PAGE_TOKEN", "page_token")


async def test_attention_jobs_page_by_last_change(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    made = [await needs_attention(engine) for _ in range(3)]
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        first = await admin.ListAttentionJobs(
            admin_service_pb2.ListAttentionJobsRequest(page_size=2), metadata=SERVICE
        )
        second = await admin.ListAttentionJobs(
            admin_service_pb2.ListAttentionJobsRequest(
                page_size=2, page_token=first.next_page_token
            ),
            metadata=SERVICE,
        )
    listed = [j.job_id for j in [*first.jobs, *second.jobs]]
    # All changed at the same instant: the job id orders them.
    assert listed == sorted(made)
    assert second.next_page_token == ""


def events_token(**fields: Any) -> str:
    body: dict[str, Any] = {"_list": "job_events", "_binding": "", "event_id": 1}
    body.update(fields)
    return forged(body)


@pytest.mark.parametrize(
    "fields",
    [
        {"event_id": "1"},
        {"event_id": -1},
        {"event_id": 0},
        {"event_id": True},
        {"event_id": 2**63},
        {"event_id": 1.5},
        {"_binding": "3f2504e0-4f89-41d3-9a0c-0305e82c3301"},  # another job's token
    ],
)
async def test_a_forged_events_token_is_invalid_page_token(
    creation: CreationHarness, engine: AsyncEngine, fields: dict[str, Any]
) -> None:
    job_id = await needs_attention(engine)
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin.ListJobEvents(
                admin_service_pb2.ListJobEventsRequest(
                    job_id=job_id, page_token=events_token(**{"_binding": job_id, **fields})
                ),
                metadata=SERVICE,
            )
    assert_invalid(caught.value, "INVALID_PAGE_TOKEN", "page_token")


async def test_job_events_page_one_by_one(creation: CreationHarness, engine: AsyncEngine) -> None:
    job_id = await needs_attention(engine)  # submitted, claimed, reaped: three events
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        versions: list[int] = []
        token = ""
        while True:
            page = await admin.ListJobEvents(
                admin_service_pb2.ListJobEventsRequest(
                    job_id=job_id, page_size=1, page_token=token
                ),
                metadata=SERVICE,
            )
            versions.extend(e.version for e in page.events)
            token = page.next_page_token
            if not token:
                break
    assert len(versions) == 3
    assert versions == sorted(versions)


# --- 5. who may call ------------------------------------------------------------------


def signed_token(subject: str, lifetime: int = 3600) -> tuple[tuple[str, str], ...]:
    now = int(time.time())
    claims = {"sub": subject, "iss": "atelier", "aud": "atelier-app", "iat": now}
    return bearer(jwt.encode({**claims, "exp": now + lifetime}, DEV_JWT_SECRET, "HS256"))


@pytest.mark.parametrize(
    "credentials",
    [
        signed_token("user\x00admin"),
        signed_token("u" * 300),
        signed_token("u" * 6000),
        signed_token("alice", lifetime=100 * 365 * 86400),
    ],
    ids=["NUL in sub", "300-character sub", "6000-character sub", "valid for 100 years"],
)
async def test_a_validly_signed_but_unacceptable_token_is_token_invalid(
    creation: CreationHarness, credentials: tuple[tuple[str, str], ...]
) -> None:
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetBalance(creation_service_pb2.GetBalanceRequest(), metadata=credentials)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(caught.value).reason == "TOKEN_INVALID"
    assert "\x00" not in (caught.value.details() or "")


async def test_the_lifetime_maximum_is_a_setting(creation_url: str) -> None:
    async with (
        running_creation(creation_url, JWT_MAX_LIFETIME="600") as short,
        short.public_channel() as channel,
    ):
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        fine = await stub.GetBalance(
            creation_service_pb2.GetBalanceRequest(), metadata=signed_token("u-1", 600)
        )
        assert fine.available_points == 100
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetBalance(
                creation_service_pb2.GetBalanceRequest(), metadata=signed_token("u-1", 601)
            )
    assert error_info(caught.value).reason == "TOKEN_INVALID"


@pytest.mark.parametrize("user_id", ["user\x00admin", "u" * 300, ""])
async def test_grant_points_checks_the_user_id_by_the_same_rule(
    creation: CreationHarness, user_id: str
) -> None:
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin.GrantPoints(
                admin_service_pb2.GrantPointsRequest(user_id=user_id, amount=5, request_id="k"),
                metadata=SERVICE,
            )
    assert_invalid(caught.value, "INVALID_ADMIN_REQUEST", "user_id")
