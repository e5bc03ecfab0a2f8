"""Domain objects to protobuf messages, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import job_state_pb2
from services.creation.domain import Actor, Event, Job, Status, Step
from services.creation.media_client import OutputUrls

STATUS_TO_PROTO = {
    Status.QUEUED: job_pb2.JOB_STATUS_QUEUED,
    Status.RUNNING: job_pb2.JOB_STATUS_RUNNING,
    Status.SUCCEEDED: job_pb2.JOB_STATUS_SUCCEEDED,
    Status.FAILED: job_pb2.JOB_STATUS_FAILED,
    Status.CANCELLED: job_pb2.JOB_STATUS_CANCELLED,
    Status.NEEDS_ATTENTION: job_pb2.JOB_STATUS_NEEDS_ATTENTION,
}
STATUS_FROM_PROTO = {value: key for key, value in STATUS_TO_PROTO.items()}
STEP_TO_PROTO = {
    Step.PREPARING: job_pb2.JOB_STEP_PREPARING,
    Step.SUBMITTING: job_pb2.JOB_STEP_SUBMITTING,
    Step.GENERATING: job_pb2.JOB_STEP_GENERATING,
    Step.STORING: job_pb2.JOB_STEP_STORING,
    Step.DONE: job_pb2.JOB_STEP_DONE,
}
ACTOR_TO_PROTO = {
    Actor.USER: job_pb2.ACTOR_KIND_USER,
    Actor.WORKER: job_pb2.ACTOR_KIND_WORKER,
    Actor.REAPER: job_pb2.ACTOR_KIND_REAPER,
    Actor.OPERATOR: job_pb2.ACTOR_KIND_OPERATOR,
}


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def struct(values: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def struct_to_dict(message: struct_pb2.Struct) -> dict[str, Any]:
    """The Struct as plain Python values. Unlike json_format it keeps NaN and infinities
    (as floats) so that validation can name the field instead of the conversion failing."""
    return {name: _plain(value) for name, value in message.fields.items()}


def _plain(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return value.number_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return struct_to_dict(value.struct_value)
    if kind == "list_value":
        return [_plain(item) for item in value.list_value.values]
    return None  # null_value, or no kind set at all


def _error(job: Job) -> job_pb2.JobError | None:
    if job.error_code is None:
        return None
    return job_pb2.JobError(code=job.error_code, message=job.error_message or "")


def job_message(job: Job) -> job_pb2.Job:
    return job_pb2.Job(
        job_id=job.job_id,
        user_id=job.user_id,
        model_id=job.model_id,
        style_id=job.style_id,
        input_asset_id=job.input_asset_id,
        prompt=job.prompt,
        negative_prompt=job.negative_prompt,
        width=job.width,
        height=job.height,
        parameters=struct(job.parameters),
        status=STATUS_TO_PROTO[job.status],
        progress_percent=job.progress,
        step=STEP_TO_PROTO[job.step] if job.step else job_pb2.JOB_STEP_UNSPECIFIED,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        cancel_requested=job.cancel_requested,
        price_points=job.price_points,
        num_outputs=job.num_outputs,
        outputs=[job_pb2.JobOutput(asset_id=asset_id) for asset_id in job.outputs],
        error=_error(job),
        version=job.version,
        create_time=timestamp(job.created_at),
        start_time=timestamp(job.started_at),
        complete_time=timestamp(job.completed_at),
        update_time=timestamp(job.updated_at),
    )


def fill_output_urls(message: job_pb2.Job, urls: Mapping[str, OutputUrls]) -> job_pb2.Job:
    """Sets each output's url and thumbnail_url that ``urls`` has (by asset id); the
    message, for use in expressions."""
    for output in message.outputs:
        signed = urls.get(output.asset_id)
        if signed is None:
            continue
        output.url = signed.image.url
        output.url_expire_time.FromDatetime(signed.image.expires_at)
        if signed.thumbnail is not None:
            output.thumbnail_url = signed.thumbnail.url
            output.thumbnail_url_expire_time.FromDatetime(signed.thumbnail.expires_at)
    return message


def job_state(job: Job) -> job_state_pb2.JobState:
    """What notify projects and streams for this version of the job."""
    if job.deleted_at is not None:
        # A tombstone: the job is gone for its owner, nothing else of it is told.
        return job_state_pb2.JobState(
            job_id=job.job_id,
            user_id=job.user_id,
            version=job.version,
            status=STATUS_TO_PROTO[job.status],
            update_time=timestamp(job.updated_at),
            done=True,
            deleted=True,
        )
    return job_state_pb2.JobState(
        job_id=job.job_id,
        user_id=job.user_id,
        version=job.version,
        status=STATUS_TO_PROTO[job.status],
        step=STEP_TO_PROTO[job.step] if job.step else job_pb2.JOB_STEP_UNSPECIFIED,
        progress_percent=job.progress,
        cancel_requested=job.cancel_requested,
        outputs=[job_pb2.JobOutput(asset_id=asset_id) for asset_id in job.outputs],
        error=_error(job),
        update_time=timestamp(job.updated_at),
        done=job.status.terminal,
        attempt=job.attempt,
        next_attempt_time=timestamp(job.next_attempt_at) if job.status is Status.QUEUED else None,
    )


def event_message(event: Event) -> job_pb2.JobEvent:
    return job_pb2.JobEvent(
        job_id=event.job_id,
        version=event.version,
        from_status=STATUS_TO_PROTO[event.from_status]
        if event.from_status
        else job_pb2.JOB_STATUS_UNSPECIFIED,
        to_status=STATUS_TO_PROTO[event.to_status],
        actor_kind=ACTOR_TO_PROTO[event.actor],
        actor_id=event.actor_id,
        reason=event.reason,
        create_time=timestamp(event.created_at),
    )
