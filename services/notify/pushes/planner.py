"""The push planner the store consults inside a write's transaction (pure: planning.py's
rules with their settings and the clock). A bug in the rules never stops a Deliver."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from services.kit.logging import get_logger
from services.notify.projection import Job, Moved
from services.notify.pushes import planning
from services.notify.pushes.planning import Plan, Prior, Rules, Token

log = get_logger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class PushPlanner:
    def __init__(self, rules: Rules, clock: Callable[[], datetime] = utc_now) -> None:
        self._rules = rules
        self._clock = clock

    def for_moves(
        self,
        moved: Sequence[Moved],
        tokens: Sequence[Token],
        prior: dict[tuple[str, str, str], Prior],
    ) -> Plan:
        """The pushes a Deliver's moves imply (see planning.plan)."""
        try:
            return planning.plan(moved, tokens, prior, self._rules, self._clock())
        except Exception:
            # A bug in the rules must not wedge the outbox: the relay would deliver the
            # batch again and again. The projection still moves; these pushes are lost.
            jobs = len({change.applied.job_id for change in moved})
            log.exception("push_planning_failed", jobs=jobs)
            return Plan()

    def at_registration(self, state: Job, activity: Token, last: Prior | None) -> Plan:
        """What a Live Activity registered just now needs to show ``state``, its job's
        current state (see planning.at_registration)."""
        return planning.at_registration(state, activity, last, self._rules, self._clock())
