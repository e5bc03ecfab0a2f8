"""SubmitJob's transaction on real PostgreSQL: one job, one event, one reservation and one
outbox row; idempotency; quotas, in-flight limit and points, also under concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Status
from services.creation.errors import (
    DailyQuotaExceeded,
    IdempotencyKeyReused,
    InFlightLimitReached,
    InsufficientPoints,
    InvalidRequest,
)
from services.creation.store import jobs as store
from services.creation.store import ledger
from services.creation.store.jobs import SubmitLimits
from services.creation.store.outbox import OUTBOX_CHANNEL
from services.creation.tables import jobs, points_ledger
from services.dev.postgres import connect_kwargs
from tests.integration.creation.helpers import LIMITS, T0, command, count, new_user, side_rows


async def test_submit_writes_job_event_reservation_and_outbox(engine: AsyncEngine) -> None:
    user = new_user()
    submitted = await store.submit(engine, user, command(), LIMITS, T0)
    job = submitted.job
    assert not submitted.replayed
    assert (job.status, job.version, job.user_id, job.price_points) == (Status.QUEUED, 1, user, 5)
    assert (job.provider_code, job.provider_model) == ("stub", "stub-fast-v1")
    rows = await side_rows(engine, job.job_id)
    assert rows == {
        "events": [(1, None, "queued")],
        "outbox_versions": [1],
        "ledger": [("reserve", 5)],
    }
    async with engine.connect() as connection:
        balance = await ledger.balance(connection, user)
    assert (balance.available, balance.reserved) == (95, 5)


async def test_same_key_same_request_is_the_same_job(engine: AsyncEngine) -> None:
    user = new_user()
    request = command("key-1")
    first = await store.submit(engine, user, request, LIMITS, T0)
    again = await store.submit(
        engine, user, command("key-1", input_asset_id=request.input_asset_id), LIMITS, T0
    )
    assert again.replayed
    assert again.job.job_id == first.job.job_id
    assert await count(engine, points_ledger, user_id=user, kind="reserve") == 1


async def test_same_key_other_request_is_refused(engine: AsyncEngine) -> None:
    user = new_user()
    request = command("key-2")
    await store.submit(engine, user, request, LIMITS, T0)
    with pytest.raises(IdempotencyKeyReused):
        await store.submit(
            engine,
            user,
            command("key-2", input_asset_id=request.input_asset_id, prompt="a dog"),
            LIMITS,
            T0,
        )
    with pytest.raises(IdempotencyKeyReused):
        await store.find_replay(engine, user, command("key-2", prompt="a dog"))


async def test_keys_are_per_user(engine: AsyncEngine) -> None:
    first = await store.submit(engine, new_user(), command("shared-key"), LIMITS, T0)
    second = await store.submit(engine, new_user(), command("shared-key"), LIMITS, T0)
    assert first.job.job_id != second.job.job_id


async def test_fifty_concurrent_submits_with_one_key_make_one_job(engine: AsyncEngine) -> None:
    user = new_user()
    request = command("burst-key")
    results = await asyncio.gather(
        *(store.submit(engine, user, request, LIMITS, T0) for _ in range(50))
    )
    assert len({r.job.job_id for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert await count(engine, jobs, user_id=user) == 1
    assert await count(engine, points_ledger, user_id=user, kind="reserve") == 1


async def test_concurrent_submits_respect_the_in_flight_limit(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=100, in_flight_limit=3, max_attempts=3, welcome_points=1000)
    outcomes = await asyncio.gather(
        *(store.submit(engine, user, command(), limits, T0) for _ in range(20)),
        return_exceptions=True,
    )
    accepted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, InFlightLimitReached)]
    assert len(accepted) == 3
    assert len(refused) == 17
    assert await count(engine, jobs, user_id=user) == 3


async def test_concurrent_submits_respect_the_daily_quota(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=4, in_flight_limit=100, max_attempts=3, welcome_points=1000)
    outcomes = await asyncio.gather(
        *(store.submit(engine, user, command(), limits, T0) for _ in range(12)),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, DailyQuotaExceeded)]
    assert len(refused) == 8
    assert await count(engine, jobs, user_id=user) == 4
    # The quota resets at midnight UTC: 12 hours after T0 (noon).
    assert refused[0].retry_after_seconds == pytest.approx(12 * 3600)
    # The next day it is open again.
    await store.submit(engine, user, command(), limits, T0 + timedelta(days=1))


async def test_points_are_reserved_until_they_run_out(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=100, in_flight_limit=100, max_attempts=3, welcome_points=12)
    await store.submit(engine, user, command(), limits, T0)  # 5
    await store.submit(engine, user, command(), limits, T0)  # 10
    with pytest.raises(InsufficientPoints) as caught:
        await store.submit(engine, user, command(), limits, T0)
    assert (caught.value.available, caught.value.price) == (2, 5)
    assert await count(engine, jobs, user_id=user) == 2


async def test_welcome_grant_is_given_once(engine: AsyncEngine) -> None:
    user = new_user()
    first = await ledger.read_balance(engine, user, 100, T0)
    again = await ledger.read_balance(engine, user, 100, T0)
    assert first.available == again.available == 100
    assert await count(engine, points_ledger, user_id=user, kind="grant") == 1


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"model_id": "no-such-model"}, "MODEL_NOT_AVAILABLE"),
        ({"model_id": "stub-legacy"}, "MODEL_NOT_AVAILABLE"),
        ({"style_id": "no-such-style"}, "STYLE_NOT_AVAILABLE"),
    ],
)
async def test_catalog_problems_name_the_field(
    engine: AsyncEngine, overrides: dict[str, str], reason: str
) -> None:
    user = new_user()
    with pytest.raises(InvalidRequest) as caught:
        await store.submit(engine, user, command(**overrides), LIMITS, T0)
    assert caught.value.reason == reason
    assert caught.value.violation.field in overrides
    assert await count(engine, jobs, user_id=user) == 0
    assert await count(engine, points_ledger, user_id=user) == 0


async def test_a_commit_notifies_the_outbox_channel(engine: AsyncEngine, creation_url: str) -> None:
    listener = await asyncpg.connect(**connect_kwargs(creation_url))  # type: ignore[arg-type]
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(OUTBOX_CHANNEL, lambda *args: heard.put_nowait(args[2]))
    try:
        await store.submit(engine, new_user(), command(), LIMITS, T0)
        assert await asyncio.wait_for(heard.get(), timeout=5) == OUTBOX_CHANNEL
    finally:
        await listener.close()


async def test_a_failed_submit_leaves_nothing_behind(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=100, in_flight_limit=100, max_attempts=3, welcome_points=3)
    with pytest.raises(InsufficientPoints):
        await store.submit(engine, user, command("k"), limits, T0)
    assert await count(engine, jobs, user_id=user) == 0
    # The welcome grant rolled back with it; the next try grants it again (once).
    assert await count(engine, points_ledger, user_id=user) == 0


async def test_several_outputs_reserve_the_price_of_each(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=100, in_flight_limit=100, max_attempts=3, welcome_points=18)
    job = (await store.submit(engine, user, command(num_outputs=3), limits, T0)).job
    assert (job.num_outputs, job.price_points, job.outputs) == (3, 15, ())
    assert (await side_rows(engine, job.job_id))["ledger"] == [("reserve", 15)]
    # 3 points left: one more output of 5 does not fit, and the refusal names the total.
    with pytest.raises(InsufficientPoints) as caught:
        await store.submit(engine, user, command(num_outputs=2), limits, T0)
    assert (caught.value.available, caught.value.price) == (3, 10)


async def test_the_output_count_is_part_of_the_request(engine: AsyncEngine) -> None:
    user = new_user()
    request = command("key-outputs", num_outputs=2)
    first = await store.submit(engine, user, request, LIMITS, T0)
    same = command("key-outputs", input_asset_id=request.input_asset_id, num_outputs=2)
    assert (await store.submit(engine, user, same, LIMITS, T0)).job.job_id == first.job.job_id
    other = command("key-outputs", input_asset_id=request.input_asset_id, num_outputs=1)
    with pytest.raises(IdempotencyKeyReused):
        await store.submit(engine, user, other, LIMITS, T0)
    # One output hashes as requests made before outputs were a list (no count in it).
    one = command(num_outputs=1)
    fields = "model_id style_id input_asset_id prompt negative_prompt width height parameters"
    before = {name: getattr(one, name) for name in fields.split()}
    before["parameters"] = dict(one.parameters)
    encoded = json.dumps(before, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert one.request_hash() == hashlib.sha256(encoded.encode()).hexdigest()
