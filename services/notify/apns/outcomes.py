"""Apple's answer to one push, decided into what the sender does next (pure)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import UTC, datetime


class Next(enum.Enum):
    SENT = "sent"
    # 410 Unregistered: the token is gone; the push is dropped.
    RETIRE_TOKEN = "retire_token"
    # 400 BadDeviceToken: the token is not valid for the host (most often the wrong
    # sandbox/production environment); the push is dropped.
    BAD_TOKEN = "bad_token"
    # 403 ExpiredProviderToken: refresh the JWT and send again.
    REFRESH_TOKEN = "refresh_token"
    # 429 TooManyProviderTokenUpdates: APNs ties token updates to a connection and refused
    # this one's; a fresh connection takes the current token. Send again later on one.
    RECONNECT = "reconnect"
    # APNs refuses our credentials (key, key id, team, topic, clock): no push can go until
    # they are fixed, so the push waits (bounded) instead of failing.
    HOLD = "hold"
    # 429, 5xx, no answer: send again later.
    RETRY = "retry"
    # Any other refusal: sending again would be refused again.
    FAIL = "fail"


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange: status 0 when no answer came (``reason`` says why)."""

    status: int
    reason: str
    apns_id: str
    # 410's timestamp: since when Apple knows the token is no longer valid.
    unregistered_at: datetime | None = None
    # The connection that answered (0: none did), for ApnsClient.reconnect.
    connection: int = 0


# Refusals of our configuration rather than of one push: every push gets the same answer.
CREDENTIAL_REFUSALS = frozenset(
    {
        (403, "InvalidProviderToken"),
        (403, "ExpiredProviderToken"),
        (403, "BadEnvironmentKeyIdInToken"),
        (403, "UnrelatedKeyIdInToken"),
        (400, "BadTopic"),
        (400, "TopicDisallowed"),
    }
)
TOKEN_UPDATE_REFUSED = (429, "TooManyProviderTokenUpdates")
# Every answer that says APNs did not take our credentials (the sender's gauge and alert).
REFUSES_CREDENTIALS = CREDENTIAL_REFUSALS | {TOKEN_UPDATE_REFUSED}


def decide(answer: Answer) -> Next:
    if answer.status == 200:
        return Next.SENT
    if answer.status == 410:
        return Next.RETIRE_TOKEN
    if answer.status == 400 and answer.reason == "BadDeviceToken":
        return Next.BAD_TOKEN
    if answer.status == 403 and answer.reason == "ExpiredProviderToken":
        return Next.REFRESH_TOKEN
    if (answer.status, answer.reason) == TOKEN_UPDATE_REFUSED:
        return Next.RECONNECT
    if (answer.status, answer.reason) in CREDENTIAL_REFUSALS:
        return Next.HOLD
    if answer.status in (0, 429) or answer.status >= 500:
        return Next.RETRY
    return Next.FAIL


def unregistered_at(milliseconds: object) -> datetime | None:
    """410 bodies carry ``timestamp`` in milliseconds since the epoch."""
    if isinstance(milliseconds, int | float) and not isinstance(milliseconds, bool):
        return datetime.fromtimestamp(milliseconds / 1000, UTC)
    return None


def backoff_seconds(
    attempt: int, base: float, ceiling: float, rand: random.Random | None = None
) -> float:
    """Exponential (base · 2^(attempt-1), capped) with full jitter in its upper half, so
    replicas that failed together do not retry together."""
    raw = min(ceiling, base * 2 ** max(0, attempt - 1))
    source = rand if rand is not None else _JITTER
    return float(raw * (0.5 + 0.5 * source.random()))


_JITTER = random.Random()  # noqa: S311 (spreads retries; nothing secret)
