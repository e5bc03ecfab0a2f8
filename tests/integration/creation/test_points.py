"""Points through creation's real listeners and store: an operator grant is idempotent by
its request_id exactly as a submit is by its key, and every user gets the welcome points
once, whatever their first ledger entry was."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
)
from services.creation.errors import IdempotencyKeyReused, InsufficientPoints
from services.creation.store import jobs as store
from services.creation.store import ledger
from services.creation.store.jobs import SubmitLimits
from services.creation.store.ledger import WELCOME_GRANT_KEY
from services.creation.tables import jobs, points_ledger
from tests.integration.creation.helpers import (
    SERVICE,
    T0,
    CreationHarness,
    command,
    count,
    new_user,
    running_creation,
    user_token,
)
from tests.support.rpc import error_info

WELCOME = 100  # the service's default


@pytest.fixture
async def creation(creation_url: str) -> AsyncIterator[CreationHarness]:
    async with running_creation(creation_url) as harness:
        yield harness


def grant(user: str, amount: int, request_id: str, reason: str = "promo") -> object:
    return admin_service_pb2.GrantPointsRequest(
        user_id=user, amount=amount, request_id=request_id, reason=reason
    )


async def test_a_grant_replayed_is_the_same_grant_and_a_changed_one_is_refused(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        first = await admin.GrantPoints(grant(user, 50, "promo-1"), metadata=SERVICE)
        again = await admin.GrantPoints(grant(user, 50, "promo-1"), metadata=SERVICE)
        assert first.available_points == again.available_points == WELCOME + 50
        for changed in (grant(user, 60, "promo-1"), grant(user, 50, "promo-1", "other reason")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await admin.GrantPoints(changed, metadata=SERVICE)
            assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert error_info(caught.value).reason == "IDEMPOTENCY_KEY_REUSED"
        # Keys are per user: another user's promo-1 is a grant of its own.
        other = await admin.GrantPoints(grant(new_user(), 60, "promo-1"), metadata=SERVICE)
        assert other.available_points == WELCOME + 60
    assert await count(engine, points_ledger, user_id=user, kind="grant") == 2  # welcome + 50


async def test_a_user_whose_first_entry_is_a_grant_still_gets_the_welcome(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        granted = await admin.GrantPoints(grant(user, 7, "first-contact"), metadata=SERVICE)
    assert granted.available_points == WELCOME + 7
    async with creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        for _ in range(2):
            balance = await stub.GetBalance(
                creation_service_pb2.GetBalanceRequest(), metadata=user_token(user)
            )
            assert balance.available_points == WELCOME + 7
    assert await count(engine, points_ledger, user_id=user, grant_key=WELCOME_GRANT_KEY) == 1


async def test_an_operator_key_named_like_the_welcome_is_not_the_welcome(
    creation: CreationHarness, engine: AsyncEngine
) -> None:
    user = new_user()
    async with creation.internal_channel() as channel:
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        granted = await admin.GrantPoints(grant(user, 3, WELCOME_GRANT_KEY), metadata=SERVICE)
    assert granted.available_points == WELCOME + 3


async def test_the_welcome_arrives_once_under_concurrent_grants_and_submits(
    engine: AsyncEngine,
) -> None:
    limits = SubmitLimits(daily_quota=100, in_flight_limit=100, max_attempts=3, welcome_points=20)
    for _ in range(5):
        user = new_user()
        grants = [
            ledger.grant_points(engine, user, 1, f"g-{i}", "race", limits.welcome_points, T0)
            for i in range(10)
        ]
        submits = [store.submit(engine, user, command(), limits, T0) for _ in range(10)]
        reads = [ledger.read_balance(engine, user, limits.welcome_points, T0) for _ in range(5)]
        outcomes = await asyncio.gather(*grants, *submits, *reads, return_exceptions=True)
        unexpected = [
            o
            for o in outcomes
            if isinstance(o, BaseException) and not isinstance(o, InsufficientPoints)
        ]
        assert unexpected == []
        assert await count(engine, points_ledger, user_id=user, grant_key=WELCOME_GRANT_KEY) == 1
        made = await count(engine, jobs, user_id=user)
        final = await ledger.read_balance(engine, user, limits.welcome_points, T0)
        # 20 welcome + 10 granted, 5 reserved per job made.
        assert (final.available, final.reserved) == (30 - 5 * made, 5 * made)
        assert made >= 4  # the welcome alone pays for four


async def test_grant_points_store_refuses_a_changed_grant(engine: AsyncEngine) -> None:
    user = new_user()
    first = await ledger.grant_points(engine, user, 5, "k", "why", 0, T0)
    again = await ledger.grant_points(engine, user, 5, "k", "why", 0, T0)
    assert (first.new, again.new) == (True, False)
    assert first.balance.available == again.balance.available == 5
    with pytest.raises(IdempotencyKeyReused):
        await ledger.grant_points(engine, user, 6, "k", "why", 0, T0)
