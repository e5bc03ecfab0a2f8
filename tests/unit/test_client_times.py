"""The kit's rule for times a client states about its own clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf import timestamp_pb2

from services.kit.client_times import CLIENT_CLOCK_SKEW, client_time
from services.kit.errors import FieldViolation

NOW = datetime(2026, 12, 1, 21, 30, tzinfo=UTC)


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


def test_a_time_up_to_the_skew_ahead_or_in_the_past_is_taken() -> None:
    problems: list[FieldViolation] = []
    for moment in (NOW - timedelta(days=30), NOW, NOW + CLIENT_CLOCK_SKEW):
        assert client_time("request_time", stamp(moment), NOW, problems) == moment
    assert problems == []


def test_a_time_past_the_skew_names_the_field_and_the_window() -> None:
    problems: list[FieldViolation] = []
    far = stamp(datetime(9999, 1, 1, tzinfo=UTC))
    assert client_time("request_time", far, NOW, problems) is None
    just_over = stamp(NOW + CLIENT_CLOCK_SKEW + timedelta(seconds=1))
    assert client_time("request_time", just_over, NOW, problems) is None
    window = (
        "must be no later than the server's clock (2026-12-01T21:30:00Z) plus 300 s:"
        " at most 2026-12-01T21:35:00Z"
    )
    assert problems == [FieldViolation("request_time", window)] * 2


def test_a_stamp_that_is_no_time_is_a_violation() -> None:
    problems: list[FieldViolation] = []
    broken = timestamp_pb2.Timestamp(seconds=10**12)
    assert client_time("request_time", broken, NOW, problems) is None
    assert problems == [FieldViolation("request_time", "must be a valid time")]
