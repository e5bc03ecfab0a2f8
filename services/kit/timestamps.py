"""Moments as google.protobuf.Timestamp and back: every service converts through here, so
precision (microseconds), time zone (UTC-aware datetimes only) and unset fields are
handled one way."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# What a Timestamp may hold: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
_MIN_SECONDS = -62135596800
_MAX_SECONDS = 253402300799


def set_timestamp(stamp: timestamp_pb2.Timestamp, moment: datetime) -> None:
    """Writes ``moment`` into ``stamp`` (a message's field, or a fresh Timestamp).

    A naive datetime is refused: it names no instant, and guessing UTC or the local zone
    would each be wrong for someone."""
    if moment.utcoffset() is None:
        raise ValueError(f"a naive datetime is no instant: {moment!r}")
    # timedelta arithmetic is exact and floors: a pre-epoch moment gets negative seconds
    # and non-negative nanos, the form Timestamp requires.
    since = moment - _EPOCH
    seconds = since.days * 86400 + since.seconds
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise ValueError(f"{moment!r} is outside what a Timestamp holds")
    stamp.seconds = seconds
    stamp.nanos = since.microseconds * 1000


def to_timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    """``moment`` as a Timestamp (see ``set_timestamp``)."""
    stamp = timestamp_pb2.Timestamp()
    set_timestamp(stamp, moment)
    return stamp


def to_timestamp_or_none(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """None stays None: a message field left unset."""
    return None if moment is None else to_timestamp(moment)


def from_timestamp(stamp: timestamp_pb2.Timestamp) -> datetime:
    """The UTC-aware moment ``stamp`` holds, to the microsecond (nanoseconds truncated
    toward zero). Raises ValueError when ``stamp`` is not a valid Timestamp (out of
    range, or nanos outside 0..999,999,999): a client may send any numbers."""
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except OverflowError as error:
        raise ValueError(str(error)) from None


def field_time(message: Message, field: str) -> datetime | None:
    """The moment in ``message.field``, or None when the field is unset."""
    if not message.HasField(field):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, field)
    return from_timestamp(stamp)
