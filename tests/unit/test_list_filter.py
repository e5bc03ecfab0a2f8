"""ListJobs' filter as read from a request: every bad part named, equal filters bound
alike, different ones not."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf import timestamp_pb2

from services.creation.domain import Status
from services.creation.list_filter import JobFilter, read_filter
from services.kit.errors import ApiError


def stamp(value: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(value)
    return message


DAY = datetime(2026, 11, 30, tzinfo=UTC)
NEXT_DAY = datetime(2026, 12, 1, tzinfo=UTC)


def test_repeats_and_order_do_not_change_the_filter() -> None:
    one = read_filter([Status.RUNNING, Status.QUEUED, Status.RUNNING], None, None)
    other = read_filter([Status.QUEUED, Status.RUNNING], None, None)
    assert one == other == JobFilter((Status.QUEUED, Status.RUNNING))
    assert one.binding() == other.binding()


def test_each_part_of_the_filter_changes_the_binding() -> None:
    filters = [
        read_filter([], None, None),
        read_filter([Status.QUEUED], None, None),
        read_filter([Status.QUEUED, Status.RUNNING], None, None),
        read_filter([], stamp(DAY), None),
        read_filter([], None, stamp(DAY)),
        read_filter([], stamp(DAY), stamp(NEXT_DAY)),
    ]
    assert len({f.binding() for f in filters}) == len(filters)


def test_a_range_is_half_open() -> None:
    chosen = read_filter([], stamp(DAY), stamp(NEXT_DAY))
    assert (chosen.created_from, chosen.created_before) == (DAY, NEXT_DAY)


@pytest.mark.parametrize(
    ("statuses", "after", "before", "fields"),
    [
        ([Status.QUEUED, None], None, None, ["statuses[1]"]),
        ([], stamp(NEXT_DAY), stamp(DAY), ["create_time_before"]),
        ([], stamp(DAY), stamp(DAY), ["create_time_before"]),
        ([], timestamp_pb2.Timestamp(seconds=-(10**12)), None, ["create_time_after"]),
        (
            [None],
            None,
            timestamp_pb2.Timestamp(seconds=0, nanos=-1),
            ["statuses[0]", "create_time_before"],
        ),
    ],
    ids=["unknown status", "inverted", "empty", "out of range", "several"],
)
def test_a_bad_filter_names_each_bad_field(
    statuses: list[Status | None],
    after: timestamp_pb2.Timestamp | None,
    before: timestamp_pb2.Timestamp | None,
    fields: list[str],
) -> None:
    with pytest.raises(ApiError) as caught:
        read_filter(statuses, after, before)
    assert caught.value.reason == "INVALID_JOB_FILTER"
    assert [v.field for v in caught.value.violations] == fields
