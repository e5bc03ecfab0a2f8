"""What a Deliver does, whoever calls it: apply the batch to the projection
(version-gated: duplicates and reordering change nothing) and, in the same transaction,
record the pushes what moved implies; then, once that has committed, hand what moved to
the publisher (the streams' fan-out). A publisher that loses a change costs latency,
never correctness: the backstop reads the projection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.kit.logging import get_logger
from services.kit.outages import Throttle
from services.notify.projection import AppliedState, Job
from services.notify.pushes.planner import PushPlanner
from services.notify.store import ProjectionStore

log = get_logger(__name__)


class Publisher(Protocol):
    async def publish(self, applied: Sequence[AppliedState]) -> None:
        """Announces changes the projection has committed, in ``seq`` order."""


class Delivery:
    def __init__(
        self,
        projection: ProjectionStore,
        publisher: Publisher,
        planner: PushPlanner | None = None,
    ) -> None:
        self._projection = projection
        self._publisher = publisher
        self._planner = planner
        self._log = Throttle()

    async def deliver(self, states: Sequence[Job]) -> list[AppliedState]:
        """Applies ``states`` and announces what moved; returns it, in ``seq`` order.
        Returns only after the commit, so a caller that got an answer may forget them."""
        applied = await self._projection.apply(states, self._planner)
        try:
            await self._publisher.publish(applied)
        except Exception as error:
            # Committed already: a lost announcement costs latency (the backstop reads
            # the projection), so the relay must not deliver the batch again for it.
            if self._log.admit(type(error).__name__) is not None:
                log.warning("publish_failed", error=type(error).__name__, changes=len(applied))
        return applied
