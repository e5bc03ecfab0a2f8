"""notify's values (pure): what a client registers, a device as it is listed, and what a
job feed (WatchAllJobs) asks for."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class DeviceRegistration:
    user_id: str
    token: str
    environment: str
    bundle_id: str
    locale: str
    push_to_start_token: str | None


@dataclass(frozen=True)
class DeviceRow:
    device_id: str
    environment: str
    bundle_id: str
    locale: str
    has_push_to_start_token: bool
    created_at: datetime
    registered_at: datetime


@dataclass(frozen=True)
class DeviceCursor:
    """The last device of a page (newest first)."""

    created_at: datetime
    device_id: str


@dataclass(frozen=True)
class ActivityRegistration:
    user_id: str
    job_id: str
    device_id: str
    token: str
    activity_id: str


@dataclass(frozen=True)
class FeedRequest:
    """A WatchAllJobs request, checked: resume after ``after_seq`` (None: from now), the
    jobs of ``user_ids`` and ``model_ids`` only (empty: all)."""

    after_seq: int | None
    user_ids: tuple[str, ...]
    model_ids: frozenset[str]

    def wants(self, model_id: str) -> bool:
        return not self.model_ids or model_id in self.model_ids


@dataclass(frozen=True)
class FailedPushCursor:
    """The last failed push of a page (newest first)."""

    created_at: datetime
    push_id: int


@dataclass(frozen=True)
class FailedPush:
    """A push that did not reach its device, as an operator sees it (never the token)."""

    push_id: int
    kind: str
    status: str
    job_id: str
    version: int
    user_id: str
    token_suffix: str
    environment: str
    attempts: int
    http_status: int | None
    reason: str | None
    apns_id: str | None
    created_at: datetime
    last_attempt_at: datetime | None
