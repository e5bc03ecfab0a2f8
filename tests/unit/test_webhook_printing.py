"""The webhook body's printer gives what protobuf's own JSON printer gives, with every
field without presence printed, for every shape a job takes (and hands a message type
with a field of a kind it does not cover to protobuf's printer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format, timestamp_pb2

from atelier.creation.v1 import error_reason_pb2, job_pb2, parameters_pb2
from services.creation.webhooks import printing


def full_job() -> job_pb2.Job:
    job = job_pb2.Job(
        job_id="3f0c0000-0000-0000-0000-000000000001",
        user_id="u-42",
        model_id="stub-fast",
        style_id="watercolor",
        input_asset_id="9a1e0000-0000-0000-0000-000000000002",
        prompt='a fox in the snow, "quoted" and ünïcode',
        negative_prompt="blur",
        width=512,
        height=-1,
        status=job_pb2.JOB_STATUS_SUCCEEDED,
        progress_percent=100,
        step=job_pb2.JOB_STEP_GENERATING,
        attempt=2,
        max_attempts=3,
        cancel_requested=True,
        price_points=2**31 - 1,
        version=2**62,
        num_outputs=2,
        done=True,
        queue_position=7,
    )
    job.error.reason = error_reason_pb2.JOB_ERROR_REASON_PROVIDER_RATE_LIMITED
    job.error.retryable = True
    job.error.message = "slow down"
    for field in (job.create_time, job.start_time, job.complete_time, job.update_time):
        field.FromDatetime(datetime(2026, 12, 3, 7, 12, 45, 120000, tzinfo=UTC))
    job.next_attempt_time.FromDatetime(datetime(2026, 12, 3, 7, 12, 45, tzinfo=UTC))
    job.estimated_start_time.FromDatetime(datetime(2026, 12, 3, 7, 12, 45, 1, tzinfo=UTC))
    signed = job.outputs.add(asset_id="a1", url="https://x/a1", width=64, height=64)
    signed.url_expire_time.FromDatetime(datetime(2026, 12, 3, 8, 0, tzinfo=UTC))
    signed.thumbnail_url = "https://x/t1"
    signed.thumbnail_url_expire_time.FromDatetime(datetime(2026, 12, 3, 8, 0, tzinfo=UTC))
    signed.content_type, signed.size_bytes = "image/png", 12345
    job.outputs.add(asset_id="a2")
    job.parameters["seed"].int_value = -(2**63)
    job.parameters["strength"].float_value = 0.5
    job.parameters["steps"].float_value = float("nan")
    job.parameters["hdr"].bool_value = False
    job.parameters["sampler"].string_value = ""
    return job


def shapes() -> list[job_pb2.Job]:
    unknown = job_pb2.Job(job_id="j", version=1)
    unknown.status = 99  # type: ignore[assignment]  # a number the enum does not name
    empty_error = job_pb2.Job(job_id="j")
    empty_error.error.SetInParent()
    return [
        job_pb2.Job(),
        job_pb2.Job(job_id="j", user_id="u", version=5, status=job_pb2.JOB_STATUS_CANCELLED),
        job_pb2.Job(job_id="j", version=6, deleted=True, done=True),
        full_job(),
        unknown,
        empty_error,
    ]


@pytest.mark.parametrize("job", shapes())
def test_the_printer_prints_a_job_as_protobufs_json_printer_does(job: job_pb2.Job) -> None:
    expected = json_format.MessageToDict(job, always_print_fields_with_no_presence=True)
    assert printing.to_dict(job) == expected


def test_a_message_type_with_a_field_the_printer_does_not_cover_goes_to_protobufs() -> None:
    value = parameters_pb2.ParameterValue(float_value=1e300)
    assert printing.printer(value.DESCRIPTOR) is printing._by_json_format
    assert printing.to_dict(value) == {"floatValue": 1e300}


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        (0, 0),
        (1_764_745_965, 120_000_000),
        (1_764_745_965, 120_005_000),
        (1_764_745_965, 1),
        (-1, 999_999_999),
        (-62135596800, 0),
        (253402300799, 999_000_000),
    ],
)
def test_a_timestamp_prints_as_protobuf_prints_it(seconds: int, nanos: int) -> None:
    stamp = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    assert printing.to_dict(job_pb2.Job(create_time=stamp))["createTime"] == (stamp.ToJsonString())


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 3, 7, 12, 45, tzinfo=UTC),
        datetime(2026, 12, 3, 7, 12, 45, 120000, tzinfo=UTC),
        datetime(2026, 12, 3, 7, 12, 45, 120005, tzinfo=UTC),
        datetime(2026, 12, 3, 8, 12, 45, 1, tzinfo=timezone(timedelta(hours=1))),
        datetime(2026, 12, 3, 7, 12, 45, 500000),  # naive: UTC
    ],
)
def test_a_moment_prints_as_the_timestamp_set_from_it(moment: datetime) -> None:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    assert printing.rfc3339(moment) == stamp.ToJsonString()


def test_an_invalid_timestamp_is_refused_as_protobuf_refuses_it() -> None:
    stamp = timestamp_pb2.Timestamp(seconds=253402300800)
    with pytest.raises(ValueError, match="Timestamp is not valid"):
        printing.to_dict(job_pb2.Job(update_time=stamp))
