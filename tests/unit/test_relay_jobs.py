"""The relay reads an outbox payload into a Job without ParseDict: whatever the
payload, the message (or the refusal) is exactly ParseDict's, ignoring unknown fields."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from atelier.creation.v1 import job_pb2
from services.creation import convert
from services.creation.relay.jobs import read_job
from tests.unit.test_creation_convert import VARIANTS

QUEUED = json_format.MessageToDict(convert.outbox_job(VARIANTS["queued"]))

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
    # What the payload builders wrote before migration 0022.
    "error with the old code": {**QUEUED, "error": {"code": "TIMEOUT", "message": "m"}},
    "unknown error reason": {**QUEUED, "error": {"reason": "JOB_ERROR_REASON_NEW"}},
    "error reason as a number": {**QUEUED, "error": {"reason": 8}},
    "error reason unspecified": {**QUEUED, "error": {"reason": "JOB_ERROR_REASON_UNSPECIFIED"}},
    "error retryable false": {
        **QUEUED,
        "error": {"reason": "JOB_ERROR_REASON_OUTCOME_UNKNOWN", "retryable": False},
    },
    "output with a url": {**QUEUED, "outputs": [{"assetId": "a", "url": "u"}]},
    "outputs not a list": {**QUEUED, "outputs": {"assetId": "a"}},
    "job id as a number": {**QUEUED, "jobId": 5},
    "price as a string (before 0020)": {**QUEUED, "pricePoints": "5"},
    "price zero": {**QUEUED, "pricePoints": 0},
    "price past int32": {**QUEUED, "pricePoints": 2**31},
    "width zero": {**QUEUED, "width": 0},
    "width as a float": {**QUEUED, "width": 512.0},
    "create time not a time": {**QUEUED, "createTime": "soon"},
    "parameters not an object": {**QUEUED, "parameters": []},
    "parameter not an object": {**QUEUED, "parameters": {"seed": 7}},
    "parameter of no value": {**QUEUED, "parameters": {"seed": {}}},
    "parameter of two values": {
        **QUEUED,
        "parameters": {"a": {"intValue": "1", "boolValue": True}},
    },
    "parameter of an unknown kind": {**QUEUED, "parameters": {"a": {"listValue": []}}},
    "int as a number": {**QUEUED, "parameters": {"seed": {"intValue": 7}}},
    "int not a number": {**QUEUED, "parameters": {"seed": {"intValue": "seven"}}},
    "int past int64": {**QUEUED, "parameters": {"seed": {"intValue": str(2**63)}}},
    "int with a plus": {**QUEUED, "parameters": {"seed": {"intValue": "+7"}}},
    "float as a string": {**QUEUED, "parameters": {"s": {"floatValue": "1"}}},
    "float as NaN": {**QUEUED, "parameters": {"s": {"floatValue": "NaN"}}},
    "bool as a number": {**QUEUED, "parameters": {"hdr": {"boolValue": 1}}},
    "string as a number": {**QUEUED, "parameters": {"sampler": {"stringValue": 2}}},
    # What the payload builder wrote before migration 0023 (ParseDict drops it).
    "former generation parameters": {**QUEUED, "generationParameters": {"seed": "7"}},
    "former job state": {
        "jobId": QUEUED["jobId"],
        "userId": QUEUED["userId"],
        "version": "3",
        "status": "JOB_STATUS_RUNNING",
        "step": "JOB_STEP_GENERATING",
        "progressPercent": 40,
        "attempt": 1,
        "updateTime": "2026-11-30T12:00:00Z",
    },
    "not an object": ["jobId"],
    "empty": {},
}


def _parse_dict(payload: Any) -> job_pb2.Job | type[Exception]:
    state = job_pb2.Job()
    try:
        json_format.ParseDict(payload, state, ignore_unknown_fields=True)
    except json_format.ParseError:
        return json_format.ParseError
    return state


def _read(payload: Any) -> job_pb2.Job | type[Exception]:
    state = job_pb2.Job()
    try:
        read_job(payload, state)
    except json_format.ParseError:
        return json_format.ParseError
    return state


@pytest.mark.parametrize("name", VARIANTS)
def test_every_payload_a_writer_makes_reads_as_parse_dict_reads_it(name: str) -> None:
    payload = json_format.MessageToDict(convert.outbox_job(VARIANTS[name]))
    read = _read(payload)
    assert read == _parse_dict(payload)
    assert isinstance(read, job_pb2.Job)
    assert read.SerializeToString(deterministic=True) == _parse_dict(payload).SerializeToString(  # type: ignore[union-attr]
        deterministic=True
    )


@pytest.mark.parametrize("name", ODD)
def test_any_other_payload_reads_or_fails_as_parse_dict(name: str) -> None:
    assert _read(ODD[name]) == _parse_dict(ODD[name])
