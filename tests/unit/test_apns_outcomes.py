"""Apple's answers decided into the sender's next step; backoff grows, is capped and
jittered."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from services.notify.apns.outcomes import Answer, Next, backoff_seconds, decide, unregistered_at
from services.notify.apns.rules import payload_limit, token_tail, topic_for


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (200, "", Next.SENT),
        (410, "Unregistered", Next.RETIRE_TOKEN),
        (410, "ExpiredToken", Next.RETIRE_TOKEN),
        (400, "BadDeviceToken", Next.BAD_TOKEN),
        (403, "ExpiredProviderToken", Next.REFRESH_TOKEN),
        (429, "TooManyRequests", Next.RETRY),
        (500, "InternalServerError", Next.RETRY),
        (503, "ServiceUnavailable", Next.RETRY),
        (0, "ConnectError", Next.RETRY),
        (429, "TooManyProviderTokenUpdates", Next.RECONNECT),
        (400, "BadTopic", Next.HOLD),
        (400, "TopicDisallowed", Next.HOLD),
        (403, "InvalidProviderToken", Next.HOLD),
        (403, "BadEnvironmentKeyIdInToken", Next.HOLD),
        (400, "DeviceTokenNotForTopic", Next.FAIL),
        (403, "MissingProviderToken", Next.FAIL),
        (413, "PayloadTooLarge", Next.FAIL),
    ],
)
def test_each_answer_maps_to_one_next_step(status: int, reason: str, expected: Next) -> None:
    assert decide(Answer(status, reason, "id")) is expected


def test_the_410_timestamp_is_read_as_milliseconds() -> None:
    assert unregistered_at(1_700_000_000_000) == datetime.fromtimestamp(1_700_000_000, UTC)
    assert unregistered_at("soon") is None
    assert unregistered_at(True) is None


def test_backoff_doubles_up_to_the_ceiling_with_jitter_in_the_upper_half() -> None:
    rand = random.Random(7)
    for attempt, raw in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (20, 60.0)]:
        for _ in range(50):
            delay = backoff_seconds(attempt, 1.0, 60.0, rand)
            assert raw / 2 <= delay <= raw
    delays = {backoff_seconds(3, 1.0, 60.0, rand) for _ in range(20)}
    assert len(delays) > 1  # jittered


def test_payload_limits_and_topics_follow_apples_rules() -> None:
    assert payload_limit("alert") == 4096
    assert payload_limit("liveactivity") == 4096
    assert payload_limit("voip") == 5120
    assert topic_for("com.example.app", "alert") == "com.example.app"
    assert topic_for("com.example.app", "liveactivity") == "com.example.app.push-type.liveactivity"
    assert token_tail("ab" * 32) == "…" + "ab" * 4
