"""Per-provider limits of a worker process: the concurrency cap, the submit token bucket,
and waits that give way to a cancel or a drain without leaking a slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.creation.providers.limits import ProviderLimits, TokenBucket
from services.creation.settings import ProviderLimit


async def until(condition: Callable[[], bool]) -> None:
    """Lets the other tasks run until ``condition`` holds (no clock involved)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_the_cap_lets_in_only_max_in_flight_and_the_next_waiter_enters_on_release() -> None:
    limits = ProviderLimits({"fal": ProviderLimit(max_in_flight=2)})
    gate = limits.gate("fal")
    release = [asyncio.Event() for _ in range(5)]
    entered: list[int] = []

    async def job(index: int) -> None:
        async with limits.slot("fal", []) as held:
            assert held
            entered.append(index)
            await release[index].wait()

    tasks = [asyncio.create_task(job(i)) for i in range(5)]
    await until(lambda: len(entered) == 2 and gate.waiting == 3)
    assert gate.in_flight == 2
    release[entered[0]].set()
    await until(lambda: len(entered) == 3)
    assert gate.in_flight == 2 and gate.waiting == 2
    for event in release:
        event.set()
    await asyncio.gather(*tasks)
    assert gate.peak_in_flight == 2 and gate.in_flight == 0


async def test_a_stop_while_waiting_returns_without_a_slot_and_leaks_none() -> None:
    limits = ProviderLimits({"replicate": ProviderLimit(max_in_flight=1)})
    gate = limits.gate("replicate")
    hold = asyncio.Event()
    holding = asyncio.Event()

    async def holder() -> None:
        async with limits.slot("replicate", []):
            holding.set()
            await hold.wait()

    first = asyncio.create_task(holder())
    await holding.wait()
    cancel = asyncio.Event()
    outcome: list[bool] = []

    async def waiter() -> None:
        async with limits.slot("replicate", [cancel, asyncio.Event()]) as held:
            outcome.append(held)

    second = asyncio.create_task(waiter())
    await until(lambda: gate.waiting == 1)
    cancel.set()
    await asyncio.wait_for(second, 1)
    assert outcome == [False] and gate.waiting == 0 and gate.in_flight == 1
    hold.set()
    await first
    # The slot the stopped waiter never took is still there for the next one.
    async with limits.slot("replicate", []) as held:
        assert held and gate.in_flight == 1


async def test_a_code_without_limits_never_waits_but_still_counts() -> None:
    limits = ProviderLimits({})
    async with limits.slot("stub", []) as held, limits.slot("stub", []) as again:
        assert held and again and limits.gate("stub").in_flight == 2
    assert await limits.gate("stub").submit_token([])


async def test_the_bucket_spends_its_burst_at_once_then_one_token_per_interval() -> None:
    loop = asyncio.get_running_loop()
    bucket = TokenBucket(rate=20.0, burst=2)
    started = loop.time()
    await bucket.take()
    await bucket.take()
    assert loop.time() - started < 0.04  # the burst
    for _ in range(4):
        await bucket.take()
    # Four more tokens at 20 a second: at least 0.2 s.
    assert loop.time() - started >= 0.19


async def test_a_stop_ends_a_wait_for_a_token() -> None:
    limits = ProviderLimits({"fal": ProviderLimit(rate_per_second=0.01, burst=1)})
    gate = limits.gate("fal")
    assert await gate.submit_token([])  # the burst
    drain = asyncio.Event()
    waiting = asyncio.create_task(gate.submit_token([drain]))
    await asyncio.sleep(0)
    drain.set()
    assert await asyncio.wait_for(waiting, 1) is False
