"""An outbox payload (a JobState in protobuf's JSON form, built by creation.job_state)
read into the message the relay sends, without ``json_format.ParseDict``.

ParseDict walks the message's descriptor for every key and costs ~30 µs a row; the one
writer (``creation.job_state`` in sql/job_changes.sql, called by the job triggers) only
ever writes the canonical form below, which is read here directly in a few
microseconds. Anything else (a key not listed, a value of another type or shape, a time
with an offset) goes to ParseDict, so what a payload means never depends on which path
read it; a test holds the two equal.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import job_state_pb2
from services.kit.timestamps import set_timestamp

_STATUSES = {
    name: number
    for name, number in job_pb2.JobStatus.items()
    if number != job_pb2.JOB_STATUS_UNSPECIFIED
}
_STEPS = {
    name: number
    for name, number in job_pb2.JobStep.items()
    if number != job_pb2.JOB_STEP_UNSPECIFIED
}
# RFC 3339 in UTC with no, 3 or 6 fractional digits: how protobuf (and
# creation.rfc3339) writes a Timestamp.
_CANONICAL_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{3}|\.[0-9]{6})?Z"
)


class _NotCanonical(Exception):
    """The payload is not in the writers' form: ParseDict reads it."""


def read_state(payload: Any, state: job_state_pb2.JobState) -> None:
    """Fills the empty ``state`` from ``payload``; raises ``json_format.ParseError`` for
    a payload that is no JobState (as ParseDict, ignoring unknown fields, would)."""
    try:
        _read_canonical(payload, state)
    except _NotCanonical:
        state.Clear()
        json_format.ParseDict(payload, state, ignore_unknown_fields=True)


def _read_canonical(payload: Any, state: job_state_pb2.JobState) -> None:
    if type(payload) is not dict:
        raise _NotCanonical
    for key, value in payload.items():
        reader = _READERS.get(key)
        if reader is None:
            raise _NotCanonical
        reader(state, value)


def _string(value: Any) -> str:
    if type(value) is not str:
        raise _NotCanonical
    return value


def _positive(value: Any) -> int:
    # Defaults are left out of the canonical form, so a number written is above 0.
    if type(value) is not int or not 0 < value < 2**31:
        raise _NotCanonical
    return value


def _true(value: Any) -> bool:
    if value is not True:
        raise _NotCanonical
    return True


def _time(value: Any, into: timestamp_pb2.Timestamp) -> None:
    if type(value) is not str or _CANONICAL_TIME.fullmatch(value) is None:
        raise _NotCanonical
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _NotCanonical from None
    set_timestamp(into, moment)


def _job_id(state: job_state_pb2.JobState, value: Any) -> None:
    state.job_id = _string(value)


def _user_id(state: job_state_pb2.JobState, value: Any) -> None:
    state.user_id = _string(value)


def _version(state: job_state_pb2.JobState, value: Any) -> None:
    # int64 is a decimal string in protobuf's JSON.
    text = _string(value)
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise _NotCanonical
    state.version = int(text)


def _status(state: job_state_pb2.JobState, value: Any) -> None:
    number = _STATUSES.get(_string(value))
    if number is None:
        raise _NotCanonical
    state.status = number


def _step(state: job_state_pb2.JobState, value: Any) -> None:
    number = _STEPS.get(_string(value))
    if number is None:
        raise _NotCanonical
    state.step = number


def _progress(state: job_state_pb2.JobState, value: Any) -> None:
    state.progress_percent = _positive(value)


def _cancel_requested(state: job_state_pb2.JobState, value: Any) -> None:
    state.cancel_requested = _true(value)


def _outputs(state: job_state_pb2.JobState, value: Any) -> None:
    if type(value) is not list:
        raise _NotCanonical
    for output in value:
        if type(output) is not dict or output.keys() != {"assetId"}:
            raise _NotCanonical
        state.outputs.add(asset_id=_string(output["assetId"]))


def _error(state: job_state_pb2.JobState, value: Any) -> None:
    if type(value) is not dict or not value.keys() <= {"code", "message"} or "code" not in value:
        raise _NotCanonical
    state.error.code = _string(value["code"])
    if "message" in value:
        state.error.message = _string(value["message"])


def _update_time(state: job_state_pb2.JobState, value: Any) -> None:
    _time(value, state.update_time)


def _done(state: job_state_pb2.JobState, value: Any) -> None:
    state.done = _true(value)


def _deleted(state: job_state_pb2.JobState, value: Any) -> None:
    state.deleted = _true(value)


def _attempt(state: job_state_pb2.JobState, value: Any) -> None:
    state.attempt = _positive(value)


def _next_attempt_time(state: job_state_pb2.JobState, value: Any) -> None:
    _time(value, state.next_attempt_time)


_READERS = {
    "jobId": _job_id,
    "userId": _user_id,
    "version": _version,
    "status": _status,
    "step": _step,
    "progressPercent": _progress,
    "cancelRequested": _cancel_requested,
    "outputs": _outputs,
    "error": _error,
    "updateTime": _update_time,
    "done": _done,
    "attempt": _attempt,
    "nextAttemptTime": _next_attempt_time,
    "deleted": _deleted,
}
