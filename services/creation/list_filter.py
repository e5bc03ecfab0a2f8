"""ListJobs' filter: which statuses and which creation times, read from the request and
checked, and the binding that ties a page token to it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from services.creation.domain import Status
from services.creation.errors import Reason
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.pagination import EARLIEST, LATEST
from services.kit.timestamps import from_timestamp


@dataclass(frozen=True)
class JobFilter:
    """Jobs in any of ``statuses`` (none: any status), created in [created_from,
    created_before) where those are set."""

    statuses: tuple[Status, ...] = ()
    created_from: datetime | None = None
    created_before: datetime | None = None

    def binding(self) -> str:
        """The filter as a page token carries it: equal filters, equal bindings."""
        return ";".join(
            (
                ",".join(status.value for status in self.statuses),
                _iso(self.created_from),
                _iso(self.created_before),
            )
        )


def _iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat()


def read_filter(
    statuses: Sequence[Status | None],
    create_time_after: timestamp_pb2.Timestamp | None,
    create_time_before: timestamp_pb2.Timestamp | None,
) -> JobFilter:
    """The filter a request asks for; INVALID_ARGUMENT (INVALID_JOB_FILTER, naming each
    bad field) for an unknown status, a time out of range, or an empty or inverted range.
    ``statuses`` holds None where the request named no status we know."""
    problems = [
        FieldViolation(f"statuses[{index}]", "is not a job status")
        for index, status in enumerate(statuses)
        if status is None
    ]
    start = _moment("create_time_after", create_time_after, problems)
    end = _moment("create_time_before", create_time_before, problems)
    if start is not None and end is not None and end <= start:
        problems.append(
            FieldViolation("create_time_before", "must be later than create_time_after")
        )
    if problems:
        raise invalid_argument(Reason.INVALID_JOB_FILTER, problems)
    chosen = {status for status in statuses if status is not None}
    # Sorted: the same statuses in another order or repeated are the same filter.
    return JobFilter(tuple(sorted(chosen)), start, end)


def _moment(
    name: str, stamp: timestamp_pb2.Timestamp | None, problems: list[FieldViolation]
) -> datetime | None:
    if stamp is None:
        return None
    try:
        value = from_timestamp(stamp)
    except ValueError:
        value = None
    # Inside what a page token and PostgreSQL both hold.
    if value is None or not EARLIEST <= value <= LATEST:
        problems.append(FieldViolation(name, "is not a time between years 1 and 9999"))
        return None
    return value
