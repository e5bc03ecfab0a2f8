"""What the relay's housekeeping prunes besides the outbox's delivered rows: each table
with its own retention, deleted in batches (short transactions, each statement under the
database's statement deadline) until a batch comes back short."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import remote
from services.kit.client_times import CLIENT_CLOCK_SKEW

# (engine, delete what is older than this, at most this many) → how many were deleted.
PruneBatch = Callable[[AsyncEngine, datetime, int], Awaitable[int]]


@dataclass(frozen=True)
class Pruning:
    name: str
    retention_seconds: float
    prune: PruneBatch


def remote_prunings(retention_seconds: float) -> tuple[Pruning, ...]:
    """The remote protocol's claims and answers, kept for replays, then pruned. A replay
    is answered until its request_time is older than the retention, and that time may be
    ahead of ours by the clients' skew: rows are kept that much longer."""
    kept = retention_seconds + CLIENT_CLOCK_SKEW.total_seconds()
    return (
        Pruning("remote_claims", kept, remote.prune_claims),
        Pruning("remote_calls", kept, remote.prune_calls),
    )
