"""A periodic reading of database-derived gauges: a failed or overrun reading keeps the
gauges, says so in its own gauges, and never stops the process; an overrun reading is
not started twice."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from services.kit.readings import PeriodicReading
from services.notify.apns.rules import reason_label


def sample(name: str, reading: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"reading": reading, **labels})


async def test_a_reading_that_overruns_its_deadline_fails_and_is_not_started_twice() -> None:
    release = asyncio.Event()
    started = 0

    async def read() -> None:
        nonlocal started
        started += 1
        await release.wait()

    reading = PeriodicReading("unit-overrun", read, period_seconds=60, deadline_seconds=0.01)
    assert await reading.read_once() is False
    assert sample("atelier_reading_ok", "unit-overrun") == 0
    assert sample("atelier_reading_failures_total", "unit-overrun", kind="deadline") == 1
    assert await reading.read_once() is False
    assert started == 1  # the first one is still on its way
    release.set()
    assert await reading.read_once() is True  # it finished: that is a success
    assert sample("atelier_reading_ok", "unit-overrun") == 1
    assert (sample("atelier_reading_last_success_timestamp_seconds", "unit-overrun") or 0) > 0


async def test_a_broken_reading_is_counted_as_an_error_and_the_loop_goes_on() -> None:
    calls = 0

    async def read() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug in the statement")

    reading = PeriodicReading("unit-broken", read, period_seconds=0.001, deadline_seconds=1)
    running = asyncio.create_task(reading.run())
    await reading.wait_rounds(3)
    assert not running.done()
    await reading.stop(0)
    await running
    assert calls >= 3
    assert sample("atelier_reading_ok", "unit-broken") == 0
    assert (sample("atelier_reading_failures_total", "unit-broken", kind="error") or 0) >= 3


def test_push_reasons_become_a_bounded_label() -> None:
    assert reason_label(None) == reason_label("") == "none"
    assert reason_label("Unregistered") == "Unregistered"
    assert reason_label("Timeout") == "Timeout"
    assert reason_label("SomethingAPeerMadeUp") == "other"
