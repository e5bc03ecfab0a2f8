"""Where applied changes go after the projection committed them.

Deliver calls a :class:`Publisher` once its transaction has committed, with what moved.
With Redis configured the publisher puts each change on ``job:{id}`` and ``user:{id}``
for every replica; without it (one replica, ``make dev``) :class:`InProcessPublisher`
hands them straight to this process's subscribers. A publisher that loses a change costs
latency, never correctness: the backstop reads the projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from services.kit.logging import get_logger
from services.notify.projection import AppliedState

log = get_logger(__name__)

Subscriber = Callable[[Sequence[AppliedState]], None]


class Publisher(Protocol):
    async def publish(self, applied: Sequence[AppliedState]) -> None:
        """Announces changes the projection has committed, in ``seq`` order."""


class InProcessPublisher:
    """Relays to callbacks in this process (the local streams). A subscriber must not
    block: it is called on the event loop, inside Deliver."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Adds ``subscriber``; returns the function that removes it."""
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    async def publish(self, applied: Sequence[AppliedState]) -> None:
        if not applied:
            return
        for subscriber in list(self._subscribers):
            try:
                subscriber(applied)
            except Exception:
                # One broken subscriber must not cost the others their changes.
                log.exception("subscriber_failed")
