"""Domain objects to protobuf messages, in one place."""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from atelier.creation.v1 import catalog_pb2, error_reason_pb2, job_pb2, ledger_pb2, parameters_pb2
from services.creation.catalog import CatalogModel
from services.creation.domain import Actor, Event, Job, Status, Step
from services.creation.media_client import OutputUrls
from services.creation.parameters import ParameterSpec, Scalar, from_stored, value_kind
from services.creation.queue_standing import Standing
from services.creation.store.ledger import WELCOME_GRANT_KEY
from services.creation.store.ledger_entries import LedgerEntry
from services.kit.timestamps import set_timestamp, to_timestamp, to_timestamp_or_none

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


def parameters_from_proto(
    message: Mapping[str, parameters_pb2.ParameterValue],
) -> dict[str, Scalar | None]:
    """The values sent, each of the type its sender chose; a value with nothing set is
    None (SubmitJob's check names it)."""
    values: dict[str, Any] = {}
    for name, value in message.items():
        kind = value.WhichOneof("kind")
        values[name] = getattr(value, kind) if kind is not None else None
    return values


def parameter_value(value: Scalar) -> parameters_pb2.ParameterValue:
    message = parameters_pb2.ParameterValue()
    setattr(message, f"{value_kind(value)}_value", value)
    return message


def fill_parameters(
    target: MutableMapping[str, parameters_pb2.ParameterValue], stored: Mapping[str, Any]
) -> None:
    """A job's stored parameters into a message's map, as the contract types them."""
    for name, value in from_stored(stored).items():
        target[name].CopyFrom(parameter_value(value))


_SPEC_TYPES = {
    "int": parameters_pb2.PARAMETER_TYPE_INT,
    "float": parameters_pb2.PARAMETER_TYPE_FLOAT,
    "bool": parameters_pb2.PARAMETER_TYPE_BOOL,
    "string": parameters_pb2.PARAMETER_TYPE_STRING,
    "enum": parameters_pb2.PARAMETER_TYPE_ENUM,
}


def _value(kind: str, value: Scalar | None) -> parameters_pb2.ParameterValue | None:
    """A bound or default in the spec's own type (an int64 bound stays exact)."""
    if value is None:
        return None
    if kind == "int" and isinstance(value, int):
        return parameters_pb2.ParameterValue(int_value=value)
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return parameters_pb2.ParameterValue(float_value=float(value))
    if kind == "bool" and isinstance(value, bool):
        return parameters_pb2.ParameterValue(bool_value=value)
    if kind in ("string", "enum") and isinstance(value, str):
        return parameters_pb2.ParameterValue(string_value=value)
    return None  # a value of another type says nothing a client could use


def spec_message(spec: ParameterSpec) -> parameters_pb2.ParameterSpec:
    return parameters_pb2.ParameterSpec(
        name=spec.name,
        type=_SPEC_TYPES[spec.type],
        description=spec.description,
        min=_value(spec.type, spec.min),
        max=_value(spec.type, spec.max),
        default_value=_value(spec.type, spec.default),
        choices=list(spec.choices),
    )


MEDIA_KIND_TO_PROTO = {
    "image": catalog_pb2.MEDIA_KIND_IMAGE,
    "video": catalog_pb2.MEDIA_KIND_VIDEO,
}
INPUT_IMAGE_TO_PROTO = {
    "required": catalog_pb2.INPUT_IMAGE_REQUIRED,
    "optional": catalog_pb2.INPUT_IMAGE_OPTIONAL,
    "refused": catalog_pb2.INPUT_IMAGE_REFUSED,
}


def model_message(model: CatalogModel) -> catalog_pb2.Model:
    size = model.size_range
    return catalog_pb2.Model(
        model_id=model.model_id,
        display_name=model.display_name,
        description=model.description,
        media_kind=MEDIA_KIND_TO_PROTO[model.media_kind],
        price_points=model.price_points,
        sort_order=model.sort_order,
        size_range=parameters_pb2.SizeRange(
            min_width=size.min_width,
            max_width=size.max_width,
            min_height=size.min_height,
            max_height=size.max_height,
            multiple_of=size.multiple_of,
        ),
        parameter_specs=[spec_message(spec) for spec in model.parameter_specs],
        input_image=INPUT_IMAGE_TO_PROTO.get(
            model.input_image, catalog_pb2.INPUT_IMAGE_UNSPECIFIED
        ),
    )


def _error(job: Job) -> job_pb2.JobError | None:
    """The owner's view of the job's error: its reason and flag, never the internal code."""
    if job.error_code is None:
        return None
    return job_pb2.JobError(
        reason=error_reason_pb2.JobErrorReason.Value(
            f"JOB_ERROR_REASON_{job.error_reason or 'UNSPECIFIED'}"
        ),
        retryable=bool(job.error_retryable),
        message=job.error_message or "",
    )


def job_message(job: Job) -> job_pb2.Job:
    message = job_pb2.Job(
        job_id=job.job_id,
        user_id=job.user_id,
        model_id=job.model_id,
        style_id=job.style_id,
        input_asset_id=job.input_asset_id or "",
        prompt=job.prompt,
        negative_prompt=job.negative_prompt,
        width=job.width,
        height=job.height,
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
        create_time=to_timestamp(job.created_at),
        start_time=to_timestamp_or_none(job.started_at),
        complete_time=to_timestamp_or_none(job.completed_at),
        update_time=to_timestamp(job.updated_at),
        done=job.status.terminal,
        next_attempt_time=to_timestamp(job.next_attempt_at)
        if job.status is Status.QUEUED
        else None,
        deleted=job.deleted_at is not None,
    )
    fill_parameters(message.parameters, job.parameters)
    return message


def fill_standing(message: job_pb2.Job, standings: Mapping[str, Standing]) -> job_pb2.Job:
    """Sets a queued job's queue_position and estimated_start_time from ``standings``
    (by job id); the message, for use in expressions."""
    standing = standings.get(message.job_id)
    if standing is not None:
        message.queue_position = standing.position
        if standing.estimated_start is not None:
            set_timestamp(message.estimated_start_time, standing.estimated_start)
    return message


def fill_output_urls(message: job_pb2.Job, urls: Mapping[str, OutputUrls]) -> job_pb2.Job:
    """Sets each output's url, thumbnail_url, dimensions, type and length that ``urls``
    has (by asset id); the message, for use in expressions."""
    for output in message.outputs:
        signed = urls.get(output.asset_id)
        if signed is None:
            continue
        output.url = signed.image.url
        set_timestamp(output.url_expire_time, signed.image.expires_at)
        output.width, output.height = signed.width, signed.height
        output.content_type, output.size_bytes = signed.content_type, signed.size_bytes
        if signed.thumbnail is not None:
            output.thumbnail_url = signed.thumbnail.url
            set_timestamp(output.thumbnail_url_expire_time, signed.thumbnail.expires_at)
    return message


def outbox_job(job: Job) -> job_pb2.Job:
    """The job as its outbox row carries it to notify (what creation.job_message builds
    in SQL, held equal by tests): the job_message, or a deleted job's tombstone, of which
    nothing else is told."""
    if job.deleted_at is None:
        return job_message(job)
    return job_pb2.Job(
        job_id=job.job_id,
        user_id=job.user_id,
        version=job.version,
        status=STATUS_TO_PROTO[job.status],
        update_time=to_timestamp(job.updated_at),
        done=True,
        deleted=True,
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
        create_time=to_timestamp(event.created_at),
        requester_kind=ACTOR_TO_PROTO[event.requester]
        if event.requester
        else job_pb2.ACTOR_KIND_UNSPECIFIED,
        requester_id=event.requester_id,
        via=event.via,
    )


LEDGER_KIND_TO_PROTO = {
    "grant": ledger_pb2.LEDGER_ENTRY_KIND_GRANT,
    "reserve": ledger_pb2.LEDGER_ENTRY_KIND_RESERVE,
    "capture": ledger_pb2.LEDGER_ENTRY_KIND_CAPTURE,
    "release": ledger_pb2.LEDGER_ENTRY_KIND_RELEASE,
}
# The reasons the system writes are codes ("submitted", "succeeded", an error code);
# operators write prose (ResolveJob's and GrantPoints' reasons), which stays internal.
_CODE_LIKE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def shown_reason(entry: LedgerEntry) -> str:
    """The entry's reason as its owner may see it: a code, never an operator's words."""
    if entry.kind == "grant":
        return "welcome" if entry.grant_key == WELCOME_GRANT_KEY else ""
    return entry.reason if _CODE_LIKE.match(entry.reason) else ""


def ledger_entry_message(entry: LedgerEntry) -> ledger_pb2.LedgerEntry:
    return ledger_pb2.LedgerEntry(
        entry_id=str(entry.entry_id),
        kind=LEDGER_KIND_TO_PROTO.get(entry.kind, ledger_pb2.LEDGER_ENTRY_KIND_UNSPECIFIED),
        amount=entry.amount,
        job_id=entry.job_id or "",
        reason=shown_reason(entry),
        create_time=to_timestamp(entry.created_at),
    )
