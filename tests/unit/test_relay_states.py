"""The relay reads an outbox payload into a JobState without ParseDict: whatever the
payload, the message (or the refusal) is exactly ParseDict's, ignoring unknown fields."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from atelier.notify.v1 import job_state_pb2
from services.creation import convert
from services.creation.relay.states import read_state
from tests.unit.test_creation_convert import VARIANTS

QUEUED = json_format.MessageToDict(convert.job_state(VARIANTS["queued"]))

# Payloads no writer makes: each must read as ParseDict reads it (or fail as it fails).
ODD = {
    "unknown key": {**QUEUED, "somethingNew": 1},
    "proto field name": {**QUEUED, "job_id": "x"},
    "version as a number": {**QUEUED, "version": 7},
    "negative version": {**QUEUED, "version": "-3"},
    "version not a number": {**QUEUED, "version": "ninety-nine"},
    "status as a number": {**QUEUED, "status": 3},
    "unknown status": {**QUEUED, "status": "JOB_STATUS_SOMETHING"},
    "status unspecified": {**QUEUED, "status": "JOB_STATUS_UNSPECIFIED"},
    "progress as a string": {**QUEUED, "progressPercent": "40"},
    "progress as a bool": {**QUEUED, "progressPercent": True},
    "progress zero": {**QUEUED, "progressPercent": 0},
    "progress too large": {**QUEUED, "progressPercent": 2**31},
    "done false": {**QUEUED, "done": False},
    "done as a number": {**QUEUED, "done": 1},
    "time with an offset": {**QUEUED, "updateTime": "2026-11-30T12:00:00+02:00"},
    "time with a space": {**QUEUED, "updateTime": "2026-11-30 12:00:00Z"},
    "time with nanoseconds": {**QUEUED, "updateTime": "2026-11-30T12:00:00.123456789Z"},
    "time before the epoch": {**QUEUED, "updateTime": "1969-12-31T23:59:59.500Z"},
    "time not a time": {**QUEUED, "updateTime": "yesterday"},
    "empty error": {**QUEUED, "error": {}},
    "error message only": {**QUEUED, "error": {"message": "m"}},
    "output with a url": {**QUEUED, "outputs": [{"assetId": "a", "url": "u"}]},
    "outputs not a list": {**QUEUED, "outputs": {"assetId": "a"}},
    "job id as a number": {**QUEUED, "jobId": 5},
    "not an object": ["jobId"],
    "empty": {},
}


def _parse_dict(payload: Any) -> job_state_pb2.JobState | type[Exception]:
    state = job_state_pb2.JobState()
    try:
        json_format.ParseDict(payload, state, ignore_unknown_fields=True)
    except json_format.ParseError:
        return json_format.ParseError
    return state


def _read(payload: Any) -> job_state_pb2.JobState | type[Exception]:
    state = job_state_pb2.JobState()
    try:
        read_state(payload, state)
    except json_format.ParseError:
        return json_format.ParseError
    return state


@pytest.mark.parametrize("name", VARIANTS)
def test_every_payload_a_writer_makes_reads_as_parse_dict_reads_it(name: str) -> None:
    payload = json_format.MessageToDict(convert.job_state(VARIANTS[name]))
    read = _read(payload)
    assert read == _parse_dict(payload)
    assert isinstance(read, job_state_pb2.JobState)
    assert read.SerializeToString(deterministic=True) == _parse_dict(payload).SerializeToString(  # type: ignore[union-attr]
        deterministic=True
    )


@pytest.mark.parametrize("name", ODD)
def test_any_other_payload_reads_or_fails_as_parse_dict(name: str) -> None:
    assert _read(ODD[name]) == _parse_dict(ODD[name])
