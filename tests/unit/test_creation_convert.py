"""creation's conversions: typed parameters keep presence and precision, a model's
schema keeps exact bounds, and the outbox payload the store writes without
protobuf is exactly the Job's protobuf JSON."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format

from atelier.creation.v1 import creation_service_pb2, job_pb2, parameters_pb2
from services.creation import convert, submission
from services.creation.catalog import CatalogModel
from services.creation.domain import Job, Status, Step
from services.creation.parameters import ParameterSpec, SizeRange, to_stored

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
    parameters=to_stored({"seed": 7}),
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
        BASE,
        status=Status.FAILED,
        error_code="UNAVAILABLE",
        error_message="busy",
        error_reason="PROVIDER_UNAVAILABLE",
        error_retryable=True,
    ),
    "failed for good": dataclasses.replace(
        BASE,
        status=Status.FAILED,
        error_code="INPUT_UNREADABLE",
        error_message="too many pixels",
        error_reason="PROVIDER_REJECTED_INPUT",
        error_retryable=False,
    ),
    "needs attention, no message": dataclasses.replace(
        BASE,
        status=Status.NEEDS_ATTENTION,
        error_code="OUTCOME_UNKNOWN",
        error_message="",
        error_reason="OUTCOME_UNKNOWN",
        error_retryable=False,
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
    "cancelled": dataclasses.replace(
        BASE,
        status=Status.CANCELLED,
        attempt=1,
        started_at=datetime(2026, 11, 30, 12, 0, 2, tzinfo=UTC),
        completed_at=datetime(2026, 11, 30, 12, 0, 3, 1000, tzinfo=UTC),
    ),
    "a parameter of each type, a negative prompt, no price": dataclasses.replace(
        BASE,
        negative_prompt="blur",
        price_points=0,
        parameters=to_stored(
            {
                "seed": -(2**63),
                "steps": 0,
                "guidance_scale": 7.5,
                "strength": 0.0,
                "hdr": False,
                "sampler": "ddim",
                "caption": "",
            }
        ),
    ),
    "no parameters": dataclasses.replace(BASE, parameters={}),
    "deleted": dataclasses.replace(
        BASE,
        status=Status.FAILED,
        attempt=1,
        error_code="UNAVAILABLE",
        error_reason="PROVIDER_UNAVAILABLE",
        error_retryable=True,
        version=5,
        deleted_at=datetime(2026, 11, 30, 13, tzinfo=UTC),
    ),
}


@pytest.mark.parametrize("job", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_outbox_json_reads_back_as_the_same_job(job: Job) -> None:
    """The outbox's form (creation.job_message, held equal to this JSON by
    tests/integration/creation/test_fenced_batches.py) loses nothing of the job."""
    payload = json_format.MessageToDict(convert.outbox_job(job))
    assert json_format.ParseDict(payload, job_pb2.Job()) == convert.outbox_job(job)


@pytest.mark.parametrize("name", [name for name, job in VARIANTS.items() if job.deleted_at is None])
def test_the_outbox_job_is_the_job_get_job_answers(name: str) -> None:
    """One job shape: what notify streams is what GetJob and ListJobs answer."""
    job = VARIANTS[name]
    assert convert.outbox_job(job) == convert.job_message(job)
    assert convert.job_message(job).model_id == "stub-fast"


def test_a_deleted_jobs_outbox_job_is_a_tombstone() -> None:
    """Its identity, version, last status and the flags; nothing a client would show."""
    deleted = dataclasses.replace(
        VARIANTS["succeeded"], version=6, deleted_at=datetime(2026, 11, 30, 13, tzinfo=UTC)
    )
    assert json_format.MessageToDict(convert.outbox_job(deleted)) == {
        "jobId": BASE.job_id,
        "userId": BASE.user_id,
        "version": "6",
        "status": "JOB_STATUS_SUCCEEDED",
        "updateTime": "2026-11-30T12:00:00Z",
        "done": True,
        "deleted": True,
    }


def test_a_job_says_done_attempt_and_next_attempt_time() -> None:
    retry = convert.outbox_job(VARIANTS["queued for a retry"])
    assert (retry.done, retry.attempt) == (False, 2)
    assert retry.next_attempt_time.ToDatetime(tzinfo=UTC) == datetime(
        2026, 11, 30, 12, 0, 30, 500000, tzinfo=UTC
    )
    running = convert.outbox_job(VARIANTS["second attempt running"])
    assert not running.HasField("next_attempt_time") and not running.done
    assert convert.outbox_job(VARIANTS["succeeded"]).done
    assert convert.outbox_job(VARIANTS["cancelled"]).done
    assert not convert.outbox_job(VARIANTS["needs attention, no message"]).done


def test_parameters_keep_their_types_and_a_seed_stays_exact() -> None:
    """Each value keeps the field it came in (0.0 is a float, not absent; False a bool),
    2^63-1 is not rounded, and a value with nothing set is None for the check to name."""
    request = creation_service_pb2.SubmitJobRequest(
        parameters={
            "seed": parameters_pb2.ParameterValue(int_value=2**63 - 1),
            "guidance_scale": parameters_pb2.ParameterValue(float_value=0.0),
            "hdr": parameters_pb2.ParameterValue(bool_value=False),
            "sampler": parameters_pb2.ParameterValue(string_value="ddim"),
            "empty": parameters_pb2.ParameterValue(),
        }
    )
    parameters = convert.parameters_from_proto(request.parameters)
    assert parameters == {
        "seed": 2**63 - 1,
        "guidance_scale": 0.0,
        "hdr": False,
        "sampler": "ddim",
        "empty": None,
    }
    assert type(parameters["guidance_scale"]) is float and type(parameters["hdr"]) is bool
    del parameters["empty"]
    job = job_pb2.Job()
    convert.fill_parameters(job.parameters, to_stored(parameters))  # type: ignore[arg-type]
    assert dict(job.parameters) == {k: v for k, v in request.parameters.items() if k != "empty"}
    assert json_format.MessageToDict(job)["parameters"]["seed"] == {
        "intValue": "9223372036854775807"
    }


def test_a_model_shows_its_sizes_and_exact_bounds() -> None:
    model = CatalogModel(
        model_id="m",
        display_name="M",
        description="",
        media_kind="image",
        price_points=5,
        sort_order=1,
        size_range=SizeRange(64, 2048, 128, 1024, 8),
        parameter_specs=(
            ParameterSpec("seed", "int", "s", 0, 2**63 - 1),
            ParameterSpec("strength", "float", "t", 0, 1, 0.8),
        ),
    )
    message = json_format.MessageToDict(convert.model_message(model))
    assert message["sizeRange"] == {
        "minWidth": 64,
        "maxWidth": 2048,
        "minHeight": 128,
        "maxHeight": 1024,
        "multipleOf": 8,
    }
    seed, strength = message["parameterSpecs"]
    assert seed == {
        "name": "seed",
        "type": "PARAMETER_TYPE_INT",
        "description": "s",
        "min": {"intValue": "0"},
        "max": {"intValue": "9223372036854775807"},
    }
    assert strength["min"] == {"floatValue": 0.0} and strength["defaultValue"] == {
        "floatValue": 0.8
    }


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
