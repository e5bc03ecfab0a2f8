"""Tokens already verified, so that a client sending the same bearer token on every call
pays for the signature and claim checks once (they were most of a cheap RPC's CPU)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Enough for every active user of one process many times over; each entry is a token
# string (a few hundred bytes) and its principal.
DEFAULT_MAX_ENTRIES = 10_000


class VerifiedTokens(Generic[T]):
    """Token string → what verifying it gave, until the token's ``exp``.

    Only successes are stored (a refused token is checked again every time, so a
    refusal never outlives its cause and garbage cannot fill the cache). An entry is
    served only while the wall clock is before ``exp`` itself, without the clock-skew
    leeway: past that the token goes through full verification again, which decides
    exactly as it would have without the cache. Bounded: when full, the oldest entry
    goes first."""

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[T, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str) -> T | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        value, expires_at = entry
        if self._clock() >= expires_at:
            del self._entries[token]
            return None
        return value

    def clear(self) -> None:
        """Forgets every token (a key that signed some of them is no longer trusted)."""
        self._entries.clear()

    def put(self, token: str, value: T, expires_at: float) -> None:
        if self._clock() >= expires_at:
            return
        if token not in self._entries and len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[token] = (value, expires_at)
