"""How long a call may take: the service's deadline, or the client's less a reserve for
the answer's way back (and for the sweep that ends calls, every 25 ms) when the client
allows less."""

from __future__ import annotations

import asyncio

import pytest

from services.kit.deadlines import (
    SWEEP_SECONDS,
    CallDeadline,
    CallDeadlineReached,
    budget_seconds,
    paused,
    waiting_for,
    within,
)


@pytest.mark.parametrize(
    ("client_remaining", "expected"),
    [
        (None, 3.0),  # no client deadline: the service's
        (30.0, 3.0),  # a patient client: the service's
        (3.1, 2.575),  # just over: the client's less the reserve (at most 0.5 s + 25 ms)
        (1.0, 0.775),  # a short one: less a fifth of it, and 25 ms
        (0.05, 0.015),
        (0.0, 0.0),  # already past: answer at once
    ],
)
def test_the_shorter_deadline_wins(client_remaining: float | None, expected: float) -> None:
    assert budget_seconds(3.0, client_remaining) == pytest.approx(expected)


async def test_a_wait_past_the_deadline_ends_as_the_deadline_reached() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(CallDeadlineReached):
        async with CallDeadline(0.1):
            await asyncio.Event().wait()
    assert loop.time() - started < 0.1 + 5 * SWEEP_SECONDS


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def call() -> None:
        async with CallDeadline(5):
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await asyncio.sleep(0)
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_paused_clock_does_not_run() -> None:
    async with CallDeadline(0.1):
        with paused():
            await asyncio.sleep(0.3)
        assert within(10) > 0  # time is left after the pause


class StoreDown(Exception):
    """Stands for another dependency's outage (media's StorageUnavailable)."""


async def test_a_wait_named_for_another_dependency_ends_as_its_outage() -> None:
    with pytest.raises(StoreDown):
        async with CallDeadline(0.05):
            with waiting_for(StoreDown):
                await asyncio.Event().wait()
    # Once that wait is over, the database's again.
    with pytest.raises(CallDeadlineReached):
        async with CallDeadline(0.05):
            with waiting_for(StoreDown):
                await asyncio.sleep(0)
            await asyncio.Event().wait()
