"""The job state machine, pure: statuses, steps, which transitions are legal and what
each does to the points ledger. No I/O here; the store applies these rules with
conditional updates and PostgreSQL enforces them again with CHECK constraints."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NEEDS_ATTENTION = "needs_attention"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
# Jobs that count against the in-flight limit.
IN_FLIGHT = (Status.QUEUED, Status.RUNNING)


class Step(enum.StrEnum):
    """The worker's position inside an attempt. It decides what the reaper may retry."""

    PREPARING = "preparing"
    SUBMITTING = "submitting"
    GENERATING = "generating"
    STORING = "storing"
    DONE = "done"


class Actor(enum.StrEnum):
    USER = "user"
    WORKER = "worker"
    REAPER = "reaper"
    OPERATOR = "operator"


class LedgerKind(enum.StrEnum):
    RESERVE = "reserve"
    CAPTURE = "capture"
    RELEASE = "release"
    GRANT = "grant"


# Every legal status change. Same-status updates (heartbeats, cancel requests) are not
# status changes and are not listed. PostgreSQL refuses every other change itself
# (migration 0016's trigger; tests/integration/creation/test_transitions.py keeps the two
# tables equal).
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.QUEUED, Status.RUNNING),
        (Status.QUEUED, Status.CANCELLED),
        (Status.RUNNING, Status.SUCCEEDED),
        (Status.RUNNING, Status.QUEUED),
        (Status.RUNNING, Status.FAILED),
        (Status.RUNNING, Status.CANCELLED),
        (Status.RUNNING, Status.NEEDS_ATTENTION),
        (Status.NEEDS_ATTENTION, Status.QUEUED),
        (Status.NEEDS_ATTENTION, Status.FAILED),
        (Status.NEEDS_ATTENTION, Status.CANCELLED),
    }
)


def may_change(source: Status, target: Status) -> bool:
    return (source, target) in TRANSITIONS


def ledger_effect(target: Status) -> LedgerKind | None:
    """What reaching ``target`` does to the job's reservation. Success captures it; failure
    and cancellation release it (the user got nothing). NEEDS_ATTENTION holds it until an
    operator decides; QUEUED and RUNNING keep it open."""
    if target is Status.SUCCEEDED:
        return LedgerKind.CAPTURE
    if target in (Status.FAILED, Status.CANCELLED):
        return LedgerKind.RELEASE
    return None


class ReapDecision(enum.Enum):
    RETRY = "retry"  # nothing reached the provider: queue a new attempt
    RESUME = "resume"  # the provider has the request: queue, keep the request id, poll again
    ATTENTION = "attention"  # the provider may or may not have it: an operator decides
    FAIL = "fail"  # attempts exhausted
    CANCEL = "cancel"  # the owner asked to cancel and nothing is unknown


def reap_decision(
    step: Step | None,
    has_request: bool,
    cancel_requested: bool,
    attempts_left: bool,
    provider_idempotent: bool,
) -> ReapDecision:
    """What to do with a RUNNING job whose lease expired."""
    unknown_outcome = step is Step.SUBMITTING and not has_request and not provider_idempotent
    if unknown_outcome:
        return ReapDecision.ATTENTION
    if cancel_requested:
        return ReapDecision.CANCEL
    if has_request:
        return ReapDecision.RESUME
    return ReapDecision.RETRY if attempts_left else ReapDecision.FAIL


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> timedelta:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempt-1))]."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return timedelta(seconds=(rng or random).uniform(0, ceiling))


def retry_delay(
    attempt: int, base: float, cap: float, at_least_seconds: float | None = None
) -> timedelta:
    """``backoff``, but never sooner than the provider asked (a 429's Retry-After)."""
    delay = backoff(attempt, base, cap)
    if at_least_seconds is not None:
        delay = max(delay, timedelta(seconds=at_least_seconds))
    return delay


# SubmitJob's bounds on num_outputs (0 in a request means 1).
MIN_OUTPUTS, MAX_OUTPUTS = 1, 4


def quota_day_start(now: datetime) -> datetime:
    """The start of the UTC day whose submits count against the daily quota."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def quota_reset_time(now: datetime) -> datetime:
    """When the daily quota starts again: the next midnight UTC."""
    return quota_day_start(now) + timedelta(days=1)


def output_key(job_id: str, attempt: int, index: int) -> str:
    """media's idempotency key for one output of one attempt: a worker that resumes the
    attempt (same request, same attempt number) lands onto the same asset, and a later
    attempt never shares an asset with an earlier one. Prefixed with our service's name,
    since media's keys are per owner, whoever calls."""
    return f"creation:job:{job_id}:attempt:{attempt}:output:{index}"


def output_keys(job_id: str, attempt: int, num_outputs: int) -> list[str]:
    return [output_key(job_id, attempt, index) for index in range(num_outputs)]


@dataclass(frozen=True)
class Job:
    """A job row as the domain sees it."""

    job_id: str
    user_id: str
    model_id: str
    style_id: str
    provider_code: str
    provider_model: str
    price_points: int
    # None: made from the prompt alone (a text-to-image model).
    input_asset_id: str | None
    prompt: str
    negative_prompt: str
    width: int
    height: int
    parameters: dict[str, Any]
    status: Status
    progress: int
    step: Step | None
    priority: int
    attempt: int
    max_attempts: int
    next_attempt_at: datetime
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: datetime | None
    provider_request_id: str | None
    # The error's internal code (a provider's, or atelier's own: job_errors.py); what the
    # owner is told of it is error_reason and error_retryable, set with it.
    error_code: str | None
    error_message: str | None
    cancel_requested: bool
    num_outputs: int
    # The output asset ids, in the provider's order; empty until SUCCEEDED.
    outputs: tuple[str, ...]
    idempotency_key: str | None
    request_hash: str
    version: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    # The submit's trace context (W3C traceparent); None when it was not traced.
    trace_parent: str | None = None
    # When its owner deleted it (a tombstone: see DeleteJob); None while it is shown.
    deleted_at: datetime | None = None
    # The version of the adapter that made the submit of its provider request (set as the
    # worker marks SUBMITTING); None before any submit.
    provider_version: str | None = None
    # What the owner is told of error_code (job_errors.py): a JobErrorReason's name
    # without its prefix, and whether submitting again may help; None without an error.
    error_reason: str | None = None
    error_retryable: bool | None = None


@dataclass(frozen=True)
class Event:
    event_id: int
    job_id: str
    version: int
    from_status: Status | None
    to_status: Status
    actor: Actor
    actor_id: str
    reason: str
    created_at: datetime
    # Who asked to cancel: on a cancel request (its status unchanged) and on the
    # CANCELLED that ends it; None on every other event.
    requester: Actor | None = None
    requester_id: str = ""
    # The service identity that acted for the user (a user's event only); "" otherwise.
    via: str = ""
