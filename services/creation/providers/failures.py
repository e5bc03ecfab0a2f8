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
    # What the job's error tells its owner when this code ends the job: a JobErrorReason
    # (its name without JOB_ERROR_REASON_; one value per row), and whether submitting the
    # same request again, as a new job, may succeed (JobError.retryable). ``retryable``
    # above is the worker's: whether another attempt of this job may.
    reason: str
    resubmit: bool


def _row(
    code: str,
    retryable: bool,
    kind: Kind,
    description: str,
    *,
    reason: str,
    resubmit: bool,
    ambiguous_on_submit: bool = False,
) -> FailureKind:
    return FailureKind(code, retryable, kind, ambiguous_on_submit, description, reason, resubmit)


FAILURES: dict[str, FailureKind] = {
    f.code: f
    for f in (
        _row(
            "TIMEOUT",
            True,
            Kind.CALL,
            "no answer in time",
            ambiguous_on_submit=True,
            reason="PROVIDER_TIMEOUT",
            resubmit=True,
        ),
        _row(
            "UNAVAILABLE",
            True,
            Kind.CALL,
            "refused, reset or a 5xx",
            reason="PROVIDER_UNAVAILABLE",
            resubmit=True,
        ),
        _row(
            "RATE_LIMITED",
            True,
            Kind.CALL,
            "the provider asked us to slow down",
            reason="PROVIDER_RATE_LIMITED",
            resubmit=True,
        ),
        # Our key or account was refused (401, 402, 403): every attempt would be refused
        # alike until an operator fixes the key or the account.
        _row(
            "AUTH_REJECTED",
            False,
            Kind.CALL,
            "our credentials were refused",
            reason="PROVIDER_AUTH_REJECTED",
            resubmit=False,
        ),
        _row(
            "TRANSIENT",
            True,
            Kind.GENERATION,
            "the generation failed; may pass",
            reason="PROVIDER_TRANSIENT_FAILURE",
            resubmit=True,
        ),
        # The provider says it has no such request, so nothing runs or is charged for it:
        # a fresh submit is safe (unlike a submit whose outcome is unknown).
        _row(
            "REQUEST_UNKNOWN",
            True,
            Kind.GENERATION,
            "no such request",
            reason="PROVIDER_REQUEST_LOST",
            resubmit=True,
        ),
        _row(
            "CONTENT_REJECTED",
            False,
            Kind.GENERATION,
            "refused by policy",
            reason="PROVIDER_REJECTED_CONTENT",
            resubmit=False,
        ),
        # Not a readable image, or more pixels than the model takes (the stub's limit).
        _row(
            "INPUT_UNREADABLE",
            False,
            Kind.GENERATION,
            "the input is unusable",
            reason="PROVIDER_REJECTED_INPUT",
            resubmit=False,
        ),
        _row(
            "INVALID_INPUT",
            False,
            Kind.GENERATION,
            "the request is invalid",
            reason="PROVIDER_INVALID_REQUEST",
            resubmit=False,
        ),
        _row(
            "CANCELLED",
            False,
            Kind.GENERATION,
            "cancelled on our request",
            reason="PROVIDER_CANCELLED",
            resubmit=True,
        ),
        _row(
            "INTERNAL",
            False,
            Kind.GENERATION,
            "the provider failed",
            reason="PROVIDER_INTERNAL",
            resubmit=True,
        ),
        # The generation succeeded (and was paid for) but its output is gone from the
        # provider's storage before we fetched it. Terminal: a new attempt would pay for
        # a second generation, and whatever delayed us (an outage, a backlog) delays every
        # job alike, so retrying would multiply the spend blindly (docs/providers.md).
        # Its owner, whose points are given back, may choose to submit again.
        _row(
            "OUTPUT_EXPIRED",
            False,
            Kind.GENERATION,
            "the output expired",
            reason="PROVIDER_OUTPUT_EXPIRED",
            resubmit=True,
        ),
        # The provider's output is not an image we accept (type, size, or undecodable).
        _row(
            "OUTPUT_INVALID",
            False,
            Kind.GENERATION,
            "the output is unusable",
            reason="PROVIDER_OUTPUT_INVALID",
            resubmit=False,
        ),
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
