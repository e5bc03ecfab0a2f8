"""What an attempt is given besides its job and lease: the engine's parts, the worker's
drain, the hook at named points, and a bounded record of how attempts ended."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.media_client import MediaClient
from services.creation.object_transfer import ObjectTransfer
from services.creation.providers.base import Provider
from services.creation.providers.limits import ProviderLimits
from services.creation.settings import CreationSettings
from services.creation.worker.fenced_writer import FencedWriter
from services.kit.clock import Clock

# Called at each named point of an attempt (before_submit, after_submit, polling,
# after_upload, after_output, before_complete): the stub provider's crash injection hooks in here.
PointHook = Callable[[str], None]


def no_point(name: str) -> None:
    return None


class Drain:
    """The worker's stop, as its attempts see it: once ``asked``, nothing new reaches a
    provider; once ``due``, polling attempts hand their jobs back."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.due = asyncio.Event()

    def begin(self, hand_back_at: float) -> None:
        self.asked.set()
        loop = asyncio.get_running_loop()
        loop.call_at(hand_back_at, self.due.set)


class RecentOutcomes:
    """How the newest attempts ended, by job id (tests and debugging read it); bounded,
    so a worker that runs for months keeps only the latest."""

    def __init__(self, size: int = 1024) -> None:
        self._items: OrderedDict[str, str] = OrderedDict()
        self._size = size

    def record(self, job_id: str, outcome: str) -> None:
        self._items[job_id] = outcome
        self._items.move_to_end(job_id)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def get(self, job_id: str) -> str | None:
        return self._items.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._items

    def __getitem__(self, job_id: str) -> str:
        return self._items[job_id]


@dataclass(frozen=True)
class AttemptContext:
    engine: AsyncEngine
    media: MediaClient
    providers: Mapping[str, Provider]
    settings: CreationSettings
    clock: Clock
    drain: Drain
    # Every fenced write of an attempt goes through it, so concurrent ones share one
    # statement.
    writer: FencedWriter
    on_point: PointHook = no_point
    outcomes: RecentOutcomes = field(default_factory=RecentOutcomes)
    # Each provider's concurrency cap and submit rate in this process (limits.py).
    limits: ProviderLimits = field(default_factory=ProviderLimits)
    # The signed URLs' HTTP client: inputs and outputs go through it, not media's gRPC.
    transfer: ObjectTransfer = field(default_factory=ObjectTransfer)
