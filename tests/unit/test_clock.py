"""The kit's clocks: the system one is aware UTC; the settable one moves only when told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from services.kit.clock import Clock, SettableClock, system_clock


def test_the_system_clock_is_aware_utc() -> None:
    now = system_clock()
    assert now.tzinfo == UTC
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)


def test_a_settable_clock_moves_only_when_told() -> None:
    start = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)
    clock: Clock = SettableClock(start)
    assert clock() == clock() == start
    assert isinstance(clock, SettableClock)
    clock.advance(2)
    assert clock() == datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC)
    clock.set(datetime(2027, 1, 1, 9, tzinfo=timezone(timedelta(hours=9))))
    assert clock() == datetime(2027, 1, 1, tzinfo=UTC)
    assert clock().tzinfo == UTC


def test_a_settable_clock_refuses_naive_times() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        SettableClock(datetime(2026, 1, 1))
