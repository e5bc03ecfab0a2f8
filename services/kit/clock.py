"""The time, as the code sees it: an aware UTC datetime from a callable, so tests can
set and move it instead of waiting for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> datetime:
        """Now, timezone-aware, in UTC."""
        ...


def system_clock() -> datetime:
    return datetime.now(UTC)


class SettableClock:
    """A clock a test sets and moves; it never moves by itself."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = system_clock() if start is None else _aware(start)

    def __call__(self) -> datetime:
        return self.now

    def set(self, when: datetime) -> None:
        self.now = _aware(when)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _aware(when: datetime) -> datetime:
    if when.tzinfo is None:
        raise ValueError("a clock holds timezone-aware times")
    return when.astimezone(UTC)
