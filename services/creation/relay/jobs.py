"""A job's message (an atelier.creation.v1.Job in protobuf's JSON form, built by
creation.job_message: the relay's take statement and the webhook fan-out build it from
the job's row, a webhook delivery keeps what its fan-out built) read into the message
the relay or the webhook deliverer sends, without ``json_format.ParseDict``.

ParseDict walks the message's descriptor for every key and costs ~30 µs a row; the one
writer (``creation.job_message`` in sql/job_changes.sql) only ever writes the canonical
form below, which is read here directly in a few microseconds. Anything else (a key not
listed, a value of another type or shape, a time with an offset) goes to ParseDict, so
what a payload means never depends on which path read it; a test holds the two equal.
Payloads written before migration 0019 hold notify's former JobState, whose keys are all
Job's (but error.code, which migration 0022 replaced by error.reason: ParseDict drops
it): they read the same way (their int64 pricePoints, a string then, goes to ParseDict).
Migration 0023 rewrote the generationParameters of rows written before it into the
parameters map.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from atelier.creation.v1 import error_reason_pb2, job_pb2
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
# UNSPECIFIED too: the writer names it for an error of no reason (none, by the CHECK).
_ERROR_REASONS = dict(error_reason_pb2.JobErrorReason.items())
# RFC 3339 in UTC with no, 3 or 6 fractional digits: how protobuf (and
# creation.rfc3339) writes a Timestamp.
_CANONICAL_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{3}|\.[0-9]{6})?Z"
)


class _NotCanonical(Exception):
    """The payload is not in the writers' form: ParseDict reads it."""


def read_job(payload: Any, job: job_pb2.Job) -> None:
    """Fills the empty ``job`` from ``payload``; raises ``json_format.ParseError`` for
    a payload that is no Job (as ParseDict, ignoring unknown fields, would)."""
    try:
        _read_canonical(payload, job)
    except _NotCanonical:
        job.Clear()
        json_format.ParseDict(payload, job, ignore_unknown_fields=True)


def _read_canonical(payload: Any, job: job_pb2.Job) -> None:
    if type(payload) is not dict:
        raise _NotCanonical
    for key, value in payload.items():
        reader = _READERS.get(key)
        if reader is None:
            raise _NotCanonical
        reader(job, value)


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


def _int64(value: Any) -> int:
    # int64 is a decimal string in protobuf's JSON; a default (0) is left out.
    text = _string(value)
    if not (text.isascii() and text.isdigit() and len(text) <= 18 and text[0] != "0"):
        raise _NotCanonical
    return int(text)


def _version(job: job_pb2.Job, value: Any) -> None:
    job.version = _int64(value)


Reader = Callable[[job_pb2.Job, Any], None]


def _text(field: str) -> Reader:
    def read(job: job_pb2.Job, value: Any) -> None:
        setattr(job, field, _string(value))

    return read


def _count(field: str) -> Reader:
    def read(job: job_pb2.Job, value: Any) -> None:
        setattr(job, field, _positive(value))

    return read


def _moment(field: str) -> Reader:
    def read(job: job_pb2.Job, value: Any) -> None:
        _time(value, getattr(job, field))

    return read


def _number(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _NotCanonical
    return float(value)


def _parameters(job: job_pb2.Job, value: Any) -> None:
    # {"seed": {"intValue": "42"}, ...}: each value as SubmitJob stored it (one field set).
    if type(value) is not dict:
        raise _NotCanonical
    for name, entry in value.items():
        if type(entry) is not dict or len(entry) != 1:
            raise _NotCanonical
        [(tag, raw)] = entry.items()
        target = job.parameters[name]
        if tag == "intValue":
            text = _string(raw)
            digits = text.removeprefix("-")
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
                raise _NotCanonical
            target.int_value = int(text)
        elif tag == "floatValue":
            target.float_value = _number(raw)
        elif tag == "boolValue" and type(raw) is bool:
            target.bool_value = raw
        elif tag == "stringValue":
            target.string_value = _string(raw)
        else:
            raise _NotCanonical


def _status(job: job_pb2.Job, value: Any) -> None:
    number = _STATUSES.get(_string(value))
    if number is None:
        raise _NotCanonical
    job.status = number


def _step(job: job_pb2.Job, value: Any) -> None:
    number = _STEPS.get(_string(value))
    if number is None:
        raise _NotCanonical
    job.step = number


def _progress(job: job_pb2.Job, value: Any) -> None:
    job.progress_percent = _positive(value)


def _cancel_requested(job: job_pb2.Job, value: Any) -> None:
    job.cancel_requested = _true(value)


def _outputs(job: job_pb2.Job, value: Any) -> None:
    if type(value) is not list:
        raise _NotCanonical
    for output in value:
        if type(output) is not dict or output.keys() != {"assetId"}:
            raise _NotCanonical
        job.outputs.add(asset_id=_string(output["assetId"]))


def _error(job: job_pb2.Job, value: Any) -> None:
    # A payload written before migration 0022 has a "code" instead: ParseDict drops it.
    if (
        type(value) is not dict
        or not value.keys() <= {"reason", "retryable", "message"}
        or "reason" not in value
    ):
        raise _NotCanonical
    number = _ERROR_REASONS.get(_string(value["reason"]))
    if number is None:
        raise _NotCanonical
    job.error.SetInParent()
    job.error.reason = number
    if "retryable" in value:
        job.error.retryable = _true(value["retryable"])
    if "message" in value:
        job.error.message = _string(value["message"])


def _done(job: job_pb2.Job, value: Any) -> None:
    job.done = _true(value)


def _deleted(job: job_pb2.Job, value: Any) -> None:
    job.deleted = _true(value)


_READERS: dict[str, Reader] = {
    "jobId": _text("job_id"),
    "userId": _text("user_id"),
    "modelId": _text("model_id"),
    "styleId": _text("style_id"),
    "inputAssetId": _text("input_asset_id"),
    "prompt": _text("prompt"),
    "negativePrompt": _text("negative_prompt"),
    "width": _count("width"),
    "height": _count("height"),
    "parameters": _parameters,
    "status": _status,
    "progressPercent": _progress,
    "step": _step,
    "attempt": _count("attempt"),
    "maxAttempts": _count("max_attempts"),
    "cancelRequested": _cancel_requested,
    "pricePoints": _count("price_points"),
    "error": _error,
    "version": _version,
    "createTime": _moment("create_time"),
    "startTime": _moment("start_time"),
    "completeTime": _moment("complete_time"),
    "updateTime": _moment("update_time"),
    "numOutputs": _count("num_outputs"),
    "outputs": _outputs,
    "done": _done,
    "nextAttemptTime": _moment("next_attempt_time"),
    "deleted": _deleted,
}
