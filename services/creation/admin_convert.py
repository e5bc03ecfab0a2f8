"""InspectJob's answer from an operator's Inspection (the job and its events use
convert's messages, as every other RPC does)."""

from __future__ import annotations

from google.protobuf import duration_pb2

from atelier.creation.v1 import admin_service_pb2
from services.creation import convert
from services.creation.domain import Job
from services.creation.operators import Inspection, QueueOverview
from services.creation.provider_requests import LiveState, SeenRequest
from services.kit.timestamps import to_timestamp_or_none

_STATES = {
    LiveState.UNKNOWN: admin_service_pb2.PROVIDER_REQUEST_STATE_UNSPECIFIED,
    LiveState.RUNNING: admin_service_pb2.PROVIDER_REQUEST_STATE_RUNNING,
    LiveState.SUCCEEDED: admin_service_pb2.PROVIDER_REQUEST_STATE_SUCCEEDED,
    LiveState.FAILED: admin_service_pb2.PROVIDER_REQUEST_STATE_FAILED,
    LiveState.CANCELLED: admin_service_pb2.PROVIDER_REQUEST_STATE_CANCELLED,
    LiveState.NOT_FOUND: admin_service_pb2.PROVIDER_REQUEST_STATE_NOT_FOUND,
    LiveState.UNREACHABLE: admin_service_pb2.PROVIDER_REQUEST_STATE_UNREACHABLE,
}


def _source(request: SeenRequest) -> admin_service_pb2.ProviderRequestSource.ValueType:
    if request.recorded and request.found:
        return admin_service_pb2.PROVIDER_REQUEST_SOURCE_RECORDED_AND_FOUND
    if request.recorded:
        return admin_service_pb2.PROVIDER_REQUEST_SOURCE_RECORDED
    return admin_service_pb2.PROVIDER_REQUEST_SOURCE_FOUND


def request_message(request: SeenRequest) -> admin_service_pb2.ProviderRequest:
    return admin_service_pb2.ProviderRequest(
        request_id=request.request_id,
        source=_source(request),
        state=_STATES[request.state],
        progress_percent=request.progress,
        attempt=request.attempt,
        submit_time=to_timestamp_or_none(request.submitted_at),
        detail=request.detail,
    )


def internals_message(job: Job) -> admin_service_pb2.JobInternals:
    return admin_service_pb2.JobInternals(
        step=job.step.value if job.step else "",
        provider_code=job.provider_code,
        provider_model=job.provider_model,
        provider_request_id=job.provider_request_id or "",
        lease_owner=job.lease_owner or "",
        lease_expire_time=to_timestamp_or_none(job.lease_expires_at),
        lease_epoch=job.lease_epoch,
        error_code=job.error_code or "",
        error_message=job.error_message or "",
    )


def inspection_message(inspection: Inspection) -> admin_service_pb2.InspectJobResponse:
    view = inspection.provider
    return admin_service_pb2.InspectJobResponse(
        job=convert.job_message(inspection.job),
        internals=internals_message(inspection.job),
        events=[convert.event_message(e) for e in inspection.events],
        provider_requests=[request_message(r) for r in view.requests],
        lookup_supported=view.lookup_supported,
        lookup_note=view.note,
    )


def overview_message(overview: QueueOverview) -> admin_service_pb2.GetQueueOverviewResponse:
    age = duration_pb2.Duration()
    age.FromMilliseconds(int(overview.oldest_queued_age_seconds * 1000))
    return admin_service_pb2.GetQueueOverviewResponse(
        queued=overview.queued,
        queued_due=overview.queued_due,
        oldest_queued_age=age,
        needs_attention=overview.needs_attention,
        running=overview.running,
        running_jobs=[
            admin_service_pb2.RunningJob(job=convert.job_message(j), internals=internals_message(j))
            for j in overview.running_jobs
        ],
    )
