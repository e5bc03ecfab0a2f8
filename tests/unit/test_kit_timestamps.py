"""The kit's datetime <-> Timestamp conversions: exact to the microsecond, UTC-aware only,
and what protobuf's own FromDatetime / ToDatetime(tzinfo=UTC) give for every aware moment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from atelier.media.v1 import media_internal_service_pb2
from services.kit.timestamps import (
    field_time,
    from_timestamp,
    set_timestamp,
    to_timestamp,
    to_timestamp_or_none,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def protobufs(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


@pytest.mark.parametrize(
    ("moment", "seconds", "nanos"),
    [
        (EPOCH, 0, 0),
        (EPOCH + timedelta(microseconds=1), 0, 1000),
        # Before the epoch: seconds floor, nanos stay non-negative.
        (EPOCH - timedelta(microseconds=1), -1, 999_999_000),
        (datetime(1969, 7, 20, 20, 17, 40, 500_000, tzinfo=UTC), -14182940, 500_000_000),
        (datetime(2026, 12, 2, 1, 2, 3, 456_789, tzinfo=UTC), 1796173323, 456_789_000),
        # The same instant written in another zone.
        (
            datetime(2026, 12, 2, 3, 2, 3, 456_789, tzinfo=timezone(timedelta(hours=2))),
            1796173323,
            456_789_000,
        ),
        (datetime(1, 1, 1, tzinfo=UTC), -62135596800, 0),
        (datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), 253402300799, 999_999_000),
    ],
)
def test_a_moment_is_its_seconds_and_nanos(moment: datetime, seconds: int, nanos: int) -> None:
    stamp = to_timestamp(moment)
    assert (stamp.seconds, stamp.nanos) == (seconds, nanos)
    assert stamp == protobufs(moment)
    back = from_timestamp(stamp)
    assert back == moment and back.tzinfo is UTC


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        to_timestamp(datetime(2026, 12, 2, 1, 2, 3))


def test_a_moment_before_year_one_in_utc_is_refused() -> None:
    # Year 1 at +01:00 is still year 0 in UTC, which no Timestamp holds.
    with pytest.raises(ValueError, match="outside"):
        to_timestamp(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))))


def test_none_stays_unset() -> None:
    assert to_timestamp_or_none(None) is None
    assert to_timestamp_or_none(EPOCH) == timestamp_pb2.Timestamp()


def test_setting_a_field_to_the_epoch_marks_it_present() -> None:
    reply = media_internal_service_pb2.ReserveOutputUploadResponse()
    assert field_time(reply, "expire_time") is None
    set_timestamp(reply.expire_time, EPOCH)
    assert reply.HasField("expire_time")
    assert field_time(reply, "expire_time") == EPOCH


def test_nanoseconds_are_truncated_to_microseconds() -> None:
    assert from_timestamp(timestamp_pb2.Timestamp(seconds=-1, nanos=999_999_999)) == (
        EPOCH - timedelta(microseconds=1)
    )
    assert from_timestamp(timestamp_pb2.Timestamp(seconds=0, nanos=1999)) == (
        EPOCH + timedelta(microseconds=1)
    )


@pytest.mark.parametrize(
    "stamp",
    [
        timestamp_pb2.Timestamp(seconds=2**62),
        timestamp_pb2.Timestamp(seconds=-(10**12)),
        timestamp_pb2.Timestamp(seconds=0, nanos=-1),
        timestamp_pb2.Timestamp(seconds=0, nanos=10**9),
    ],
)
def test_a_stamp_that_is_no_time_is_a_value_error(stamp: timestamp_pb2.Timestamp) -> None:
    with pytest.raises(ValueError, match="is not valid"):
        from_timestamp(stamp)


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
    )
)
def test_every_aware_moment_converts_as_protobuf_does(moment: datetime) -> None:
    stamp = to_timestamp(moment)
    assert stamp == protobufs(moment)
    assert from_timestamp(stamp) == protobufs(moment).ToDatetime(tzinfo=UTC) == moment
