"""The failure table: which provider error codes a new attempt may cure.

Every adapter reports failures with these codes (``Failed.code``, ``ProviderError.code``),
so the worker decides retry or give up in one place, whatever the backend. A code the
table does not know keeps the flag its adapter declared, and is terminal when none is
given: an unknown error must not loop through ``max_attempts`` on a backend that will
answer the same each time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from services.creation.domain import backoff


class Kind(Enum):
    # The call got no answer worth standing by (raised as ProviderError).
    CALL = "call"
    # The provider answered that the generation failed (returned as Failed by poll).
    GENERATION = "generation"


@dataclass(frozen=True)
class FailureKind:
    code: str
    retryable: bool
    kind: Kind
    # True when a submit that ended with this code may still have been accepted: the
    # worker must not submit again (DESIGN.md: the outcome is unknown).
    ambiguous_on_submit: bool
    description: str


FAILURES: dict[str, FailureKind] = {
    f.code: f
    for f in (
        FailureKind("TIMEOUT", True, Kind.CALL, True, "no answer in time"),
        FailureKind("UNAVAILABLE", True, Kind.CALL, False, "refused, reset or a 5xx"),
        FailureKind("RATE_LIMITED", True, Kind.CALL, False, "the provider asked us to slow down"),
        # Our key or account was refused (401, 402, 403): every attempt would be refused
        # alike until an operator fixes the key or the account.
        FailureKind("AUTH_REJECTED", False, Kind.CALL, False, "our credentials were refused"),
        FailureKind("TRANSIENT", True, Kind.GENERATION, False, "the generation failed; may pass"),
        # The provider says it has no such request, so nothing runs or is charged for it:
        # a fresh submit is safe (unlike a submit whose outcome is unknown).
        FailureKind("REQUEST_UNKNOWN", True, Kind.GENERATION, False, "no such request"),
        FailureKind("CONTENT_REJECTED", False, Kind.GENERATION, False, "refused by policy"),
        FailureKind("INPUT_UNREADABLE", False, Kind.GENERATION, False, "the input is unusable"),
        FailureKind("INVALID_INPUT", False, Kind.GENERATION, False, "the request is invalid"),
        FailureKind("CANCELLED", False, Kind.GENERATION, False, "cancelled on our request"),
        FailureKind("INTERNAL", False, Kind.GENERATION, False, "the provider failed"),
        # The generation succeeded (and was paid for) but its output is gone from the
        # provider's storage before we fetched it. Terminal: a new attempt would pay for
        # a second generation, and whatever delayed us (an outage, a backlog) delays every
        # job alike, so retrying would multiply the spend blindly (docs/providers.md).
        FailureKind("OUTPUT_EXPIRED", False, Kind.GENERATION, False, "the output expired"),
        # The provider's output is not an image we accept (type, size, or undecodable).
        FailureKind("OUTPUT_INVALID", False, Kind.GENERATION, False, "the output is unusable"),
    )
}


def is_retryable(code: str, declared: bool = False) -> bool:
    """Whether a new attempt may succeed after ``code``. The table decides the codes it
    knows, whatever the adapter declared; any other code keeps ``declared`` (by default
    terminal)."""
    failure = FAILURES.get(code)
    return declared if failure is None else failure.retryable


def retry_delay(
    attempt: int,
    base_seconds: float,
    cap_seconds: float,
    retry_after_seconds: float | None = None,
    rng: random.Random | None = None,
) -> timedelta:
    """How long to wait before attempt ``attempt + 1``: exponential backoff with full
    jitter (domain.backoff), but never sooner than the provider's own ``retry_after``."""
    delay = backoff(attempt, base_seconds, cap_seconds, rng)
    if retry_after_seconds is not None:
        delay = max(delay, timedelta(seconds=min(retry_after_seconds, cap_seconds)))
    return delay
