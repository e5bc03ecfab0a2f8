"""What the APNs sender claims from the push queue and what it records of each attempt
(values; the statements are in services/notify/store/sender.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ClaimedPush:
    push_id: int
    attempt: int
    kind: str
    created_at: datetime
    expires_at: datetime | None
    headers: dict[str, str]
    payload: bytes
    token_id: Any
    token: str
    environment: str
    token_status: str
    # When this claim took it (the database's clock). A push that goes is recorded as sent
    # at this time: the planner's throttle counts an activity's next update from it, and
    # a push planned while this one is in flight is planned after its claim.
    claimed_at: datetime


@dataclass(frozen=True)
class Exchange:
    """One HTTP request and Apple's answer (status 0: none came)."""

    push_id: int
    attempt: int
    apns_id: str
    http_status: int
    reason: str
    at: datetime


@dataclass(frozen=True)
class Outcome:
    push_id: int
    attempt: int
    status: str  # pending (retry later), sent, failed, dropped
    apns_id: str | None
    http_status: int | None
    reason: str | None
    next_attempt_at: datetime | None = None
    sent: bool = False
    # The claim's time, for a push that went (see ClaimedPush.claimed_at).
    sent_at: datetime | None = None
