"""What an attempt's outcome means for its delivery: succeeded, retried later (when, by
the schedule with jitter, or the endpoint's Retry-After when longer), or failed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from services.creation.webhooks.settings import WebhookSettings

RETRIED_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class Verdict:
    state: str  # succeeded | pending | failed
    next_attempt_at: datetime | None
    ok: bool = False
    gone: bool = False


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds a Retry-After header asks for (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def retried(status: int | None) -> bool:
    """Whether an answer (None: none came) is worth another attempt. A 3xx is too: a
    redirect is never followed, and the endpoint may be fixed."""
    if status is None:
        return True
    return status in RETRIED_STATUSES or status >= 500 or 300 <= status < 400


def verdict(
    settings: WebhookSettings,
    attempts_before: int,
    status: int | None,
    retry_after_seconds: float | None,
    now: datetime,
    rng: random.Random,
) -> Verdict:
    if status is not None and 200 <= status < 300:
        return Verdict("succeeded", None, ok=True)
    if status == 410:
        return Verdict("failed", None, gone=True)
    if not retried(status) or attempts_before >= len(settings.retry_schedule):
        return Verdict("failed", None)
    delay = settings.retry_schedule[attempts_before]
    delay *= 1 + settings.jitter * (2 * rng.random() - 1)
    if retry_after_seconds is not None:
        delay = max(delay, min(retry_after_seconds, settings.retry_after_max_seconds))
    return Verdict("pending", now + timedelta(seconds=delay))
