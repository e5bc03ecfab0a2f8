"""What goes to APNs for each kind of push: the headers and the JSON body exactly as the
sender sends them (it adds only the authorization and picks the host). Pure functions.

Apple's rules kept here: alerts go to the bundle id's topic with apns-push-type alert;
Live Activity pushes go to `<bundle>.push-type.liveactivity` with apns-push-type
liveactivity, and their `aps` carries `timestamp` (seconds; ActivityKit ignores a push
older than what it shows), `event` and `content-state`; `end` carries a `dismissal-date`,
a push-to-start `start` carries `attributes-type`, `attributes` and an `alert`. Progress
goes at priority 5 (priority 10 is budgeted), starts, ends and alerts at 10. A payload
must stay within 4 KB; apns-collapse-id within 64 bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from atelier.notify.v1 import job_state_pb2
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


def content_state(state: job_state_pb2.JobState) -> dict[str, Any]:
    """What the Live Activity shows (the app's ContentState, camelCase for Codable). The
    version is left out on purpose: a push is only worth sending when this changes."""
    return {
        "status": status_name(state),
        "progress": state.progress_percent,
        "attempt": state.attempt,
        "cancelRequested": state.cancel_requested,
    }


def _timestamp(state: job_state_pb2.JobState, now: datetime) -> int:
    """When creation wrote the state (seconds); now when it carries no time."""
    if state.HasField("update_time") and state.update_time.seconds > 0:
        return int(state.update_time.seconds)
    return int(now.timestamp())


def _headers(push_type: str, topic: str, priority: int, expires_at: datetime) -> dict[str, str]:
    return {
        "apns-push-type": push_type,
        "apns-topic": topic,
        "apns-priority": str(priority),
        "apns-expiration": str(int(expires_at.timestamp())),
    }


def _activity_headers(bundle_id: str, priority: int, expires_at: datetime) -> dict[str, str]:
    return _headers("liveactivity", bundle_id + LIVE_ACTIVITY_TOPIC_SUFFIX, priority, expires_at)


def alert(state: job_state_pb2.JobState, bundle_id: str, locale: str, now: datetime) -> Push:
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


def live_activity_start(
    state: job_state_pb2.JobState, bundle_id: str, locale: str, now: datetime
) -> Push:
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
                "attributes-type": ATTRIBUTES_TYPE,
                "attributes": {"jobId": state.job_id},
                "alert": {"title": words.title, "body": words.body},
            }
        },
    )


def live_activity_update(
    state: job_state_pb2.JobState, bundle_id: str, now: datetime, send_at: datetime
) -> Push:
    """Progress, at low priority; ``send_at`` is when the throttle lets it go."""
    expires_at = send_at + UPDATE_LIFETIME
    return Push(
        kind="la_update",
        priority=PRIORITY_LOW,
        expires_at=expires_at,
        collapse_id=None,
        headers=_activity_headers(bundle_id, PRIORITY_LOW, expires_at),
        payload={
            "aps": {
                "timestamp": _timestamp(state, now),
                "event": "update",
                "content-state": content_state(state),
            }
        },
    )


def live_activity_end(
    state: job_state_pb2.JobState, bundle_id: str, now: datetime, dismiss_after: timedelta
) -> Push:
    """The terminal state; the activity leaves the Lock Screen ``dismiss_after`` later."""
    expires_at = now + END_LIFETIME
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
                "dismissal-date": int((now + dismiss_after).timestamp()),
            }
        },
    )
