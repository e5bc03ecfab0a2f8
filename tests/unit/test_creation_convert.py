"""creation's conversions: request parameters that JSON cannot hold reach validation as
numbers (so it can name the field), and the outbox payload the store writes without
protobuf is exactly the JobState's protobuf JSON."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format, struct_pb2

from atelier.notify.v1 import job_state_pb2
from services.creation import convert, submission
from services.creation.domain import Job, Status, Step
from services.creation.store.changes import outbox_payload

BASE = Job(
    job_id="3f2504e0-4f89-41d3-9a0c-0305e82c3301",
    user_id="user-1",
    model_id="stub-fast",
    style_id="watercolor",
    provider_code="stub",
    provider_model="stub-fast-v1",
    price_points=5,
    input_asset_id="7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90",
    prompt="a cat",
    negative_prompt="",
    width=512,
    height=512,
    parameters={"seed": 7},
    status=Status.QUEUED,
    progress=0,
    step=None,
    priority=0,
    attempt=0,
    max_attempts=3,
    next_attempt_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
    lease_owner=None,
    lease_epoch=0,
    lease_expires_at=None,
    provider_request_id=None,
    error_code=None,
    error_message=None,
    cancel_requested=False,
    num_outputs=1,
    outputs=(),
    idempotency_key=None,
    request_hash="0" * 64,
    version=1,
    created_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
    started_at=None,
    completed_at=None,
    updated_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
)

VARIANTS = {
    "queued": BASE,
    "running with progress": dataclasses.replace(
        BASE, status=Status.RUNNING, step=Step.GENERATING, progress=40, version=9
    ),
    "cancel requested": dataclasses.replace(BASE, status=Status.RUNNING, cancel_requested=True),
    "succeeded": dataclasses.replace(
        BASE,
        status=Status.SUCCEEDED,
        step=Step.DONE,
        progress=100,
        outputs=("5b1f0a52-3c4d-4e8f-9a0b-1c2d3e4f5a6b",),
    ),
    "succeeded with several outputs": dataclasses.replace(
        BASE,
        status=Status.SUCCEEDED,
        step=Step.DONE,
        progress=100,
        num_outputs=3,
        outputs=(
            "5b1f0a52-3c4d-4e8f-9a0b-1c2d3e4f5a6b",
            "6c2e1b63-4d5e-4f90-8b1c-2d3e4f5a6b7c",
            "7d3f2c74-5e6f-4a01-9c2d-3e4f5a6b7c8d",
        ),
    ),
    "failed with message": dataclasses.replace(
        BASE, status=Status.FAILED, error_code="PROVIDER_BUSY", error_message="busy"
    ),
    "needs attention, no message": dataclasses.replace(
        BASE, status=Status.NEEDS_ATTENTION, error_code="OUTCOME_UNKNOWN", error_message=""
    ),
    "milliseconds": dataclasses.replace(
        BASE, updated_at=datetime(2026, 11, 30, 12, 0, 1, 250000, tzinfo=UTC)
    ),
    "microseconds, another zone": dataclasses.replace(
        BASE,
        updated_at=datetime(2026, 11, 30, 23, 0, 1, 123456, tzinfo=timezone(timedelta(hours=-3))),
    ),
    "large version": dataclasses.replace(BASE, version=2**40),
    "queued for a retry": dataclasses.replace(
        BASE,
        attempt=2,
        version=7,
        next_attempt_at=datetime(2026, 11, 30, 12, 0, 30, 500000, tzinfo=UTC),
    ),
    "second attempt running": dataclasses.replace(
        BASE, status=Status.RUNNING, attempt=2, step=Step.GENERATING, progress=10
    ),
    "cancelled": dataclasses.replace(BASE, status=Status.CANCELLED, attempt=1),
    "deleted": dataclasses.replace(
        BASE,
        status=Status.FAILED,
        attempt=1,
        error_code="PROVIDER_BUSY",
        version=5,
        deleted_at=datetime(2026, 11, 30, 13, tzinfo=UTC),
    ),
}


@pytest.mark.parametrize("job", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_outbox_payload_is_the_job_state_json(job: Job) -> None:
    assert outbox_payload(job) == json_format.MessageToDict(convert.job_state(job))
    parsed = json_format.ParseDict(outbox_payload(job), job_state_pb2.JobState())
    assert parsed == convert.job_state(job)


def test_a_deleted_jobs_state_is_a_tombstone() -> None:
    """Its identity, version, last status and the flags; nothing a client would show."""
    deleted = dataclasses.replace(
        VARIANTS["succeeded"], version=6, deleted_at=datetime(2026, 11, 30, 13, tzinfo=UTC)
    )
    assert outbox_payload(deleted) == {
        "jobId": BASE.job_id,
        "userId": BASE.user_id,
        "version": "6",
        "status": "JOB_STATUS_SUCCEEDED",
        "updateTime": "2026-11-30T12:00:00Z",
        "done": True,
        "deleted": True,
    }


def test_a_job_state_says_done_attempt_and_next_attempt_time() -> None:
    retry = convert.job_state(VARIANTS["queued for a retry"])
    assert (retry.done, retry.attempt) == (False, 2)
    assert retry.next_attempt_time.ToDatetime(tzinfo=UTC) == datetime(
        2026, 11, 30, 12, 0, 30, 500000, tzinfo=UTC
    )
    running = convert.job_state(VARIANTS["second attempt running"])
    assert not running.HasField("next_attempt_time") and not running.done
    assert convert.job_state(VARIANTS["succeeded"]).done
    assert convert.job_state(VARIANTS["cancelled"]).done
    assert not convert.job_state(VARIANTS["needs attention, no message"]).done


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_reach_validation_and_are_named(value: float) -> None:
    message = struct_pb2.Struct()
    message.update({"seed": value, "steps": 30, "name": "x", "hdr": True})
    parameters = convert.struct_to_dict(message)
    assert parameters["steps"] == 30
    assert math.isnan(value) == math.isnan(parameters["seed"])
    problems = []
    submission._check_parameters(parameters, problems)
    assert [(p.field, p.description) for p in problems] == [
        ("parameters.seed", "must be a finite number")
    ]


def test_nested_values_and_null_are_kept_for_validation_to_refuse() -> None:
    message = struct_pb2.Struct()
    message.update({"nested": {"a": [1, "b"]}, "nothing": None})
    assert convert.struct_to_dict(message) == {"nested": {"a": [1.0, "b"]}, "nothing": None}


@pytest.mark.parametrize(("given", "kept"), [(0, 1), (1, 1), (4, 4)])
def test_num_outputs_zero_means_one(given: int, kept: int) -> None:
    built, problems = submission.validate(**VALID, num_outputs=given)
    assert problems == [] and built is not None and built.num_outputs == kept


@pytest.mark.parametrize("given", [-1, 5, 1000])
def test_num_outputs_out_of_range_is_named(given: int) -> None:
    built, problems = submission.validate(**VALID, num_outputs=given)
    assert built is None
    assert [p.field for p in problems] == ["num_outputs"]


VALID: dict[str, object] = {
    "idempotency_key": None,
    "model_id": "stub-fast",
    "style_id": "watercolor",
    "input_asset_id": "7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90",
    "prompt": "",
    "negative_prompt": "",
    "width": 512,
    "height": 512,
    "parameters": {},
}
