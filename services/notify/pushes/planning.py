"""Which pushes a batch of applied job updates implies (pure: the store reads the inputs
and writes the outcome in the update's own transaction).

- An alert to each of the owner's devices when a job reaches SUCCEEDED, FAILED or
  CANCELLED, or enters NEEDS_ATTENTION.
- A Live Activity `start` through each of the owner's push-to-start tokens when the job
  starts running, unless an activity is already registered for it or a start went out.
- A Live Activity `update` to each of the job's activity tokens when what the activity
  shows changed: at most one per activity per ``update_interval``; a newer update takes
  the slot of one not sent yet (which is dropped) rather than adding another.
- A Live Activity `end` on a terminal state, dropping updates that had not gone out.
- Nothing for a deleted job's tombstone (a terminal status again, one version on).

Every push is keyed by (token, job, version, kind), so a replayed delivery adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import job_state_pb2
from services.notify.projection import Moved, is_terminal
from services.notify.pushes import payloads
from services.notify.pushes.payloads import Push

_ALERTED = frozenset(
    {
        job_pb2.JOB_STATUS_SUCCEEDED,
        job_pb2.JOB_STATUS_FAILED,
        job_pb2.JOB_STATUS_CANCELLED,
        job_pb2.JOB_STATUS_NEEDS_ATTENTION,
    }
)
_RUNNING = "running"


@dataclass(frozen=True)
class Token:
    token_id: str
    user_id: str
    kind: str
    bundle_id: str
    locale: str
    # Activity tokens only.
    job_id: str | None


@dataclass(frozen=True)
class Prior:
    """The latest start or update recorded (and not dropped) for one token and job."""

    push_id: int
    kind: str
    status: str
    next_attempt_at: datetime
    sent_at: datetime | None
    content_state: dict[str, Any] | None
    # Pending, and this transaction holds its row: the sender cannot take it now.
    held: bool


@dataclass(frozen=True)
class Planned:
    token_id: str
    job_id: str
    version: int
    send_at: datetime
    push: Push


@dataclass
class Plan:
    pushes: list[Planned] = field(default_factory=list)
    # Pending pushes this transaction holds that a newer one replaces.
    dropped: list[int] = field(default_factory=list)
    # (token_id, kind, bytes) of pushes not recorded for being over APNs' size limit.
    oversized: list[tuple[str, str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Rules:
    update_interval: timedelta
    dismiss_after: timedelta


def plan(
    moved: Sequence[Moved],
    tokens: Sequence[Token],
    prior: dict[tuple[str, str, str], Prior],
    rules: Rules,
    now: datetime,
) -> Plan:
    """``prior`` is keyed by (token_id, job_id, kind) for kinds la_start and la_update."""
    result = Plan()
    for change in moved:
        state = change.applied.state
        if state.deleted:
            continue  # its owner deleted it: the terminal state's pushes were its last
        owned = [t for t in tokens if t.user_id == state.user_id]
        activities = [t for t in owned if t.kind == "activity" and t.job_id == state.job_id]
        if _alerts(change):
            for device in (t for t in owned if t.kind == "device"):
                _add(
                    result,
                    device,
                    state,
                    now,
                    payloads.alert(state, device.bundle_id, device.locale, now),
                )
        if _starts_running(change) and not activities:
            for start in (t for t in owned if t.kind == "push_to_start"):
                if (start.token_id, state.job_id, "la_start") in prior:
                    continue
                push = payloads.live_activity_start(state, start.bundle_id, start.locale, now)
                _add(result, start, state, now, push)
        if is_terminal(state):
            for start in (t for t in owned if t.kind == "push_to_start"):
                _drop_held(result, prior.get((start.token_id, state.job_id, "la_start")))
            for activity in activities:
                _drop_held(result, prior.get((activity.token_id, state.job_id, "la_update")))
                push = payloads.live_activity_end(
                    state, activity.bundle_id, now, rules.dismiss_after
                )
                _add(result, activity, state, now, push)
            continue
        for activity in activities:
            last = prior.get((activity.token_id, state.job_id, "la_update"))
            _plan_update(result, activity, state, last, rules, now)
    return result


def _alerts(change: Moved) -> bool:
    status = change.applied.state.status
    if status not in _ALERTED:
        return False
    # NEEDS_ATTENTION is alerted once on entering it, not again for each later version.
    return not (
        status == job_pb2.JOB_STATUS_NEEDS_ATTENTION and change.previous_status == "needs_attention"
    )


def _starts_running(change: Moved) -> bool:
    running = change.applied.state.status == job_pb2.JOB_STATUS_RUNNING
    return running and change.previous_status != _RUNNING


def _add(
    result: Plan, token: Token, state: job_state_pb2.JobState, send_at: datetime, push: Push
) -> None:
    if push.body_size() > payloads.MAX_PAYLOAD_BYTES:
        # Our payloads are small and bounded; one this large is a bug, not a push to send
        # (APNs would refuse it with PayloadTooLarge).
        result.oversized.append((token.token_id, push.kind, push.body_size()))
        return
    result.pushes.append(Planned(token.token_id, state.job_id, state.version, send_at, push))


def _drop_held(result: Plan, prior: Prior | None) -> None:
    if prior is not None and prior.status == "pending" and prior.held:
        result.dropped.append(prior.push_id)


def _plan_update(
    result: Plan,
    activity: Token,
    state: job_state_pb2.JobState,
    last: Prior | None,
    rules: Rules,
    now: datetime,
) -> None:
    shown = payloads.content_state(state)
    if last is not None and last.content_state == shown:
        return
    send_at = now
    if last is not None:
        if last.status == "pending" and last.held:
            # Not sent yet: the newer state takes its place in the queue.
            result.dropped.append(last.push_id)
            send_at = last.next_attempt_at
        elif last.status == "pending":
            # The sender is sending it right now.
            send_at = now + rules.update_interval
        else:
            # A sent push's next_attempt_at is where the sender's claim leased it to (tens
            # of seconds on): the interval counts from when it went.
            went = last.sent_at if last.sent_at is not None else last.next_attempt_at
            send_at = max(now, went + rules.update_interval)
    push = payloads.live_activity_update(state, activity.bundle_id, now, send_at)
    _add(result, activity, state, send_at, push)
