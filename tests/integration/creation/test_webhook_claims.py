"""The webhook claim (creation.claim_webhooks, migration 0032) on its own: an endpoint gives
a claim at most ceil(max_in_flight / parts) of its room, so a deliverer claims its slots
in parts, and an answered claim no longer counts as in flight."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import webhook_deliveries
from services.creation.store.webhook_deliveries import Attempted, Claimed
from services.kit.db import driver_connection
from tests.integration.creation.webhook_kit import endpoint, fan_out, reset, rows, submit


@pytest.fixture
async def clean(engine: AsyncEngine) -> AsyncEngine:
    await reset(engine)
    return engine


def succeeded(claimed: list[Claimed]) -> list[Attempted]:
    now = datetime.now(UTC)
    return [
        Attempted(
            row.delivery_id,
            row.claimed_until,
            row.endpoint_id,
            "succeeded",
            None,
            now,
            204,
            "",
            "",
            True,
            False,
            row.failing,
        )
        for row in claimed
    ]


async def test_a_claim_takes_a_part_of_an_endpoints_slots_and_answered_ones_come_back(
    clean: AsyncEngine,
) -> None:
    """max_in_flight 5 in two parts: claims of 3 (room left past it: claim again), then the
    2 left, then none (all five in flight); once the first three are recorded, the next
    claim takes three again (its part, the room being 3), and then nothing."""
    endpoint_id, _ = await endpoint(
        clean, "http://127.0.0.1:9/hooks", ["job.queued"], max_in_flight=5
    )
    await submit(clean, 12)
    await fan_out(clean)
    async with driver_connection(clean) as connection:
        first = await webhook_deliveries.claim(connection, 100, 30, 2)
        second = await webhook_deliveries.claim(connection, 100, 30, 2)
        third = await webhook_deliveries.claim(connection, 100, 30, 2)
        assert [len(first), len(second), len(third)] == [3, 2, 0]
        assert await webhook_deliveries.record(connection, succeeded(first), 3600) == []
        fourth = await webhook_deliveries.claim(connection, 100, 30, 2)
        fifth = await webhook_deliveries.claim(connection, 100, 30, 2)
    assert [len(fourth), len(fifth)] == [3, 0]
    # Whether the endpoint had room past the part taken (the deliverer claims again).
    assert [{row.more for row in claim} for claim in (first, second, fourth)] == [
        {True},
        {False},
        {False},
    ]
    assert {row.endpoint_id for row in first + second + fourth} == {endpoint_id}
    taken = {row.delivery_id for row in first + second + fourth}
    assert len(taken) == 8
    in_flight = await rows(clean, "claimed_until > now()")
    assert {row["delivery_id"] for row in in_flight} == taken - {row.delivery_id for row in first}
    assert len(await rows(clean, "state = 'succeeded'")) == 3


async def test_without_parts_a_claim_takes_the_whole_room_and_the_batch_limit_holds(
    clean: AsyncEngine,
) -> None:
    await endpoint(clean, "http://127.0.0.1:9/hooks", ["job.queued"], max_in_flight=5)
    await endpoint(clean, "http://127.0.0.1:9/other", ["job.queued"], max_in_flight=4)
    await submit(clean, 6)
    await fan_out(clean)
    async with driver_connection(clean) as connection:
        limited = await webhook_deliveries.claim(connection, 7, 30)
        rest = await webhook_deliveries.claim(connection, 100, 30)
    assert len(limited) == 7
    assert len(rest) == 2  # 5 + 4 slots in all
