"""Times a client states about its own clock (when it first sent a request), trusted only
within the server's clock plus a skew: a time from the future would outlive every rule
measured from it (a replay's retention never reached)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf import timestamp_pb2

from services.kit.errors import FieldViolation
from services.kit.timestamps import from_timestamp

# How far a client's clock may run ahead of the server's: enough for clocks that drift,
# small beside any retention measured from a client's time.
CLIENT_CLOCK_SKEW = timedelta(minutes=5)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def client_time(
    field: str, stamp: timestamp_pb2.Timestamp, now: datetime, problems: list[FieldViolation]
) -> datetime | None:
    """The time ``stamp`` states (field ``field``), or None with a violation in
    ``problems`` when it is not a valid time or is later than ``now`` plus the skew."""
    try:
        moment = from_timestamp(stamp)
    except ValueError:
        problems.append(FieldViolation(field, "must be a valid time"))
        return None
    latest = now + CLIENT_CLOCK_SKEW
    if moment > latest:
        skew = int(CLIENT_CLOCK_SKEW.total_seconds())
        problems.append(
            FieldViolation(
                field,
                f"must be no later than the server's clock ({_iso(now)}) plus {skew} s:"
                f" at most {_iso(latest)}",
            )
        )
        return None
    return moment
