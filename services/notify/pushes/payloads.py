"""What goes to APNs for each kind of push: the headers and the JSON body exactly as the
sender sends them (it adds only the authorization and picks the host). Pure functions.

Apple's rules kept here: alerts go to the bundle id's topic with apns-push-type alert;
Live Activity pushes go to `<bundle>.push-type.liveactivity` with apns-push-type
liveactivity, and their `aps` carries `timestamp` (seconds; ActivityKit ignores a push
older than what it shows), `event`, `content-state` and `stale-date` (when iOS shows the
activity as out of date unless a newer push came); `end` carries a `dismissal-date`,
a push-to-start `start` carries `attributes-type`, `attributes` and an `alert`. Progress
goes at priority 5 (priority 10 is budgeted), starts, ends, alerts and the entry into
NEEDS_ATTENTION at 10. A payload must stay within 4 KB; apns-collapse-id within 64 bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from atelier.creation.v1 import job_pb2
from services.notify.projection import status_name
from services.notify.pushes import texts

MAX_PAYLOAD_BYTES = 4096
MAX_COLLAPSE_ID_BYTES = 64
LIVE_ACTIVITY_TOPIC_SUFFIX = ".push-type.liveactivity"
# The app's ActivityAttributes type, which a push-to-start names, and its one attribute.
ATTRIBUTES_TYPE = "JobActivityAttributes"
# How long APNs keeps trying to deliver each kind before it is pointless.
ALERT_LIFETIME = timedelta(hours=24)
START_LIFETIME = timedelta(minutes=10)
UPDATE_LIFETIME = timedelta(minutes=10)
END_LIFETIME = timedelta(hours=8)

PRIORITY_LOW = 5
PRIORITY_HIGH = 10

# A queued or running job's activity is stale this long after the state it shows (after
# the next attempt's time, for a retry waiting its turn), unless a newer push came. A
# healthy job changes what it shows well inside that: a running job reports progress
# with each heartbeat (10 s), and a dead worker's lease expires and is reaped within
# about 75 s (lease 60 s + reaper 15 s), a change the activity hears. Five minutes leaves
# room for a provider that reports no progress for a while and for low-priority pushes
# that iOS holds back, yet a phone that stopped hearing (no network, notify or APNs away)
# shows the job as out of date rather than as still moving.
STALE_AFTER = timedelta(minutes=5)
# NEEDS_ATTENTION waits for an operator, which may take hours: nothing newer is due, so
# the state stays current for as long as iOS keeps an activity running (8 hours).
NEEDS_ATTENTION_STALE_AFTER = timedelta(hours=8)


@dataclass(frozen=True)
class Push:
    """One push to one token, as notify.pushes stores it."""

    kind: str
    priority: int
    expires_at: datetime
    collapse_id: str | None
    headers: dict[str, str]
    payload: dict[str, Any]

    def body_size(self) -> int:
        return len(encoded(self.payload))


def encoded(payload: dict[str, Any]) -> bytes:
    """The bytes the sender posts (compact JSON, UTF-8)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def content_state(state: job_pb2.Job) -> dict[str, Any]:
    """What the Live Activity shows (the app's ContentState, camelCase for Codable). The
    version is left out on purpose: a push is only worth sending when this changes."""
    return {
        "status": status_name(state),
        "progress": state.progress_percent,
        "attempt": state.attempt,
        "cancelRequested": state.cancel_requested,
    }


def _timestamp(state: job_pb2.Job, now: datetime) -> int:
    """When creation wrote the state (seconds); now when it carries no time."""
    if state.HasField("update_time") and state.update_time.seconds > 0:
        return int(state.update_time.seconds)
    return int(now.timestamp())


def stale_date(state: job_pb2.Job, now: datetime) -> int:
    """When what ``state`` shows on the activity is out of date (seconds)."""
    shown_at = _timestamp(state, now)
    if state.status == job_pb2.JOB_STATUS_NEEDS_ATTENTION:
        return shown_at + int(NEEDS_ATTENTION_STALE_AFTER.total_seconds())
    if state.HasField("next_attempt_time"):
        shown_at = max(shown_at, int(state.next_attempt_time.seconds))
    return shown_at + int(STALE_AFTER.total_seconds())


def _headers(push_type: str, topic: str, priority: int, expires_at: datetime) -> dict[str, str]:
    return {
        "apns-push-type": push_type,
        "apns-topic": topic,
        "apns-priority": str(priority),
        "apns-expiration": str(int(expires_at.timestamp())),
    }


def _activity_headers(bundle_id: str, priority: int, expires_at: datetime) -> dict[str, str]:
    return _headers("liveactivity", bundle_id + LIVE_ACTIVITY_TOPIC_SUFFIX, priority, expires_at)


def alert(state: job_pb2.Job, bundle_id: str, locale: str, now: datetime) -> Push:
    """The alert for a terminal or NEEDS_ATTENTION state, in the device's language. Its
    collapse id is the job's, so a later alert for the same job replaces an earlier one."""
    words = texts.alert(locale, state.status)
    expires_at = now + ALERT_LIFETIME
    collapse_id = f"job-{state.job_id}"
    headers = _headers("alert", bundle_id, PRIORITY_HIGH, expires_at)
    headers["apns-collapse-id"] = collapse_id
    return Push(
        kind="alert",
        priority=PRIORITY_HIGH,
        expires_at=expires_at,
        collapse_id=collapse_id,
        headers=headers,
        payload={
            "aps": {
                "alert": {"title": words.title, "body": words.body},
                "sound": "default",
                "thread-id": state.job_id,
            },
            "jobId": state.job_id,
            "status": status_name(state),
            "version": state.version,
        },
    )


def live_activity_start(state: job_pb2.Job, bundle_id: str, locale: str, now: datetime) -> Push:
    """Starts the job's Live Activity on a device through its push-to-start token."""
    words = texts.alert(locale, texts.STARTED)
    expires_at = now + START_LIFETIME
    return Push(
        kind="la_start",
        priority=PRIORITY_HIGH,
        expires_at=expires_at,
        collapse_id=None,
        headers=_activity_headers(bundle_id, PRIORITY_HIGH, expires_at),
        payload={
            "aps": {
                "timestamp": _timestamp(state, now),
                "event": "start",
                "content-state": content_state(state),
                "stale-date": stale_date(state, now),
                "attributes-type": ATTRIBUTES_TYPE,
                "attributes": {"jobId": state.job_id},
                "alert": {"title": words.title, "body": words.body},
            }
        },
    )


def live_activity_update(
    state: job_pb2.Job,
    bundle_id: str,
    now: datetime,
    send_at: datetime,
    *,
    urgent: bool = False,
) -> Push:
    """Progress, at low priority; ``send_at`` is when the throttle lets it go. ``urgent``
    (entering NEEDS_ATTENTION): at high priority."""
    priority = PRIORITY_HIGH if urgent else PRIORITY_LOW
    expires_at = send_at + UPDATE_LIFETIME
    return Push(
        kind="la_update",
        priority=priority,
        expires_at=expires_at,
        collapse_id=None,
        headers=_activity_headers(bundle_id, priority, expires_at),
        payload={
            "aps": {
                "timestamp": _timestamp(state, now),
                "event": "update",
                "content-state": content_state(state),
                "stale-date": stale_date(state, now),
            }
        },
    )


def live_activity_end(
    state: job_pb2.Job, bundle_id: str, now: datetime, dismiss_after: timedelta
) -> Push:
    """The terminal state; the activity leaves the Lock Screen ``dismiss_after`` later.
    A terminal state never changes, so it is never stale before it leaves: its stale
    date is its dismissal date."""
    expires_at = now + END_LIFETIME
    dismissal = int((now + dismiss_after).timestamp())
    return Push(
        kind="la_end",
        priority=PRIORITY_HIGH,
        expires_at=expires_at,
        collapse_id=None,
        headers=_activity_headers(bundle_id, PRIORITY_HIGH, expires_at),
        payload={
            "aps": {
                "timestamp": _timestamp(state, now),
                "event": "end",
                "content-state": content_state(state),
                "stale-date": dismissal,
                "dismissal-date": dismissal,
            }
        },
    )
