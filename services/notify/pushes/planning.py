"""Which pushes a batch of applied job updates implies (pure: the store reads the inputs
and writes the outcome in the update's own transaction).

- An alert to each of the owner's devices when a job reaches SUCCEEDED, FAILED or
  CANCELLED, or enters NEEDS_ATTENTION.
- A Live Activity `start` through each of the owner's push-to-start tokens when the job
  starts running, unless an activity is already registered for it or a start went out.
- A Live Activity `update` to each of the job's activity tokens when what the activity
  shows changed: at most one per activity per ``update_interval``; a newer update takes
  the slot of one not sent yet (which is dropped) rather than adding another. Entering
  NEEDS_ATTENTION is shown at once, at priority 10.
- A Live Activity `end` on a terminal state, dropping updates that had not gone out.
- A deleted job's tombstone (a terminal status again, one version on) plans nothing
  after its terminal state; it stands in for a terminal state notify never received.
- An activity registered after its job's last change gets the job's current state.

A move owes these to every state it went through, not only to the one it moved to (a
batch may carry a job's end and its deletion). Every push is keyed by (token, job,
version, kind), so a replayed delivery, or a registration repeated, adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from atelier.creation.v1 import job_pb2
from services.notify.projection import Moved, is_terminal, status_name
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
_NEEDS_ATTENTION = "needs_attention"
_TERMINAL_NAMES = frozenset({"succeeded", "failed", "cancelled"})


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
    """``prior`` is keyed by (token_id, job_id, kind) for kinds la_start and la_update.

    Every state a move went through is owed its pushes, not only the newest: an alert for
    each that alerts, and the end of the first terminal one. Starts and updates follow
    the newest only (an update not sent yet gives way to a newer one anyway)."""
    result = Plan()
    for change in moved:
        steps = _owed(change)
        if not steps:
            continue
        state = change.applied.state
        owned = [t for t in tokens if t.user_id == state.user_id]
        activities = [t for t in owned if t.kind == "activity" and t.job_id == state.job_id]
        for step, before in steps:
            if _alerts(step, before):
                for device in (t for t in owned if t.kind == "device"):
                    push = payloads.alert(step, device.bundle_id, device.locale, now)
                    _add(result, device, step, now, push)
        ended = next((step for step, _ in steps if is_terminal(step)), None)
        if ended is not None:
            for start in (t for t in owned if t.kind == "push_to_start"):
                _drop_held(result, prior.get((start.token_id, ended.job_id, "la_start")))
            for activity in activities:
                _drop_held(result, prior.get((activity.token_id, ended.job_id, "la_update")))
                push = payloads.live_activity_end(
                    ended, activity.bundle_id, now, rules.dismiss_after
                )
                _add(result, activity, ended, now, push)
            continue
        if not activities and any(_enters(step, before, _RUNNING) for step, before in steps):
            for start in (t for t in owned if t.kind == "push_to_start"):
                if (start.token_id, state.job_id, "la_start") in prior:
                    continue
                push = payloads.live_activity_start(state, start.bundle_id, start.locale, now)
                _add(result, start, state, now, push)
        urgent = state.status == job_pb2.JOB_STATUS_NEEDS_ATTENTION and any(
            _enters(step, before, _NEEDS_ATTENTION) for step, before in steps
        )
        for activity in activities:
            last = prior.get((activity.token_id, state.job_id, "la_update"))
            _plan_update(result, activity, state, last, rules, now, urgent=urgent)
    return result


def at_registration(
    state: job_pb2.Job,
    activity: Token,
    last: Prior | None,
    rules: Rules,
    now: datetime,
) -> Plan:
    """What an activity registered after its job's last change needs to show the job as
    it is: an update with the current state (unless ``last``, the latest start or update
    that reached this activity, already showed it), or the end of a finished job. Keyed
    like every push, so registering again adds nothing."""
    result = Plan()
    if state.deleted:
        return result
    if is_terminal(state):
        push = payloads.live_activity_end(state, activity.bundle_id, now, rules.dismiss_after)
        _add(result, activity, state, now, push)
    else:
        _plan_update(result, activity, state, last, rules, now, urgent=False)
    return result


def _owed(change: Moved) -> list[tuple[job_pb2.Job, str | None]]:
    """The states of a move that are owed pushes, each with the status before it. A
    deleted job's tombstone (its terminal status again, one version on) is owed nothing
    after its terminal state; when that state never reached notify (the relay delivered
    only the newest), the tombstone stands in for it."""
    owed = []
    for state, before in change.steps():
        if state.deleted and before in _TERMINAL_NAMES:
            break
        owed.append((state, before))
        if state.deleted:
            break
    return owed


def _alerts(state: job_pb2.Job, before: str | None) -> bool:
    if state.status not in _ALERTED:
        return False
    # NEEDS_ATTENTION is alerted once on entering it, not again for each later version.
    return not (state.status == job_pb2.JOB_STATUS_NEEDS_ATTENTION and before == _NEEDS_ATTENTION)


def _enters(state: job_pb2.Job, before: str | None, status: str) -> bool:
    return status_name(state) == status and before != status


def _add(result: Plan, token: Token, state: job_pb2.Job, send_at: datetime, push: Push) -> None:
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
    state: job_pb2.Job,
    last: Prior | None,
    rules: Rules,
    now: datetime,
    *,
    urgent: bool,
) -> None:
    """``urgent``: the job just entered NEEDS_ATTENTION; the activity shows it at once
    (priority 10, not waiting for the throttle's slot), as the alert tells the device."""
    shown = payloads.content_state(state)
    if last is not None and last.content_state == shown:
        return
    send_at = now
    if urgent:
        _drop_held(result, last)
    elif last is not None:
        if last.status == "pending" and last.held:
            # Not sent yet: the newer state takes its place in the queue.
            result.dropped.append(last.push_id)
            send_at = last.next_attempt_at
        elif last.status == "pending":
            # The sender is sending it right now: it will be recorded as sent at its
            # claim, which was before now.
            send_at = now + rules.update_interval
        else:
            # A sent push's next_attempt_at is where the sender's claim leased it to (tens
            # of seconds on): the interval counts from when it went.
            went = last.sent_at if last.sent_at is not None else last.next_attempt_at
            send_at = max(now, went + rules.update_interval)
    push = payloads.live_activity_update(state, activity.bundle_id, now, send_at, urgent=urgent)
    _add(result, activity, state, send_at, push)
