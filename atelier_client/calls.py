"""Each public call once, for both flavours: which RPC, the request, whether a retry is
safe, and what of the response the caller gets. The flavours only run a :class:`Call`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from google.protobuf.message import Message

from atelier.creation.v1 import creation_service_pb2 as creation
from atelier.creation.v1 import job_pb2
from atelier.media.v1 import asset_pb2
from atelier.media.v1 import media_service_pb2 as media
from atelier.notify.v1 import notify_service_pb2 as notify
from atelier_client import requests

Out = TypeVar("Out")
Service = Literal["creation", "media", "notify"]


@dataclass(frozen=True, slots=True)
class Call(Generic[Out]):
    service: Service
    method: str
    request: Message
    # A read, or a write the server recognises when replayed (it carries a request_id).
    retryable: bool
    unwrap: Callable[[Any], Out]
    # A removal whose replay is NOT_FOUND once an earlier attempt landed: a NOT_FOUND
    # after a retry answers the call (the thing is gone, which is what was asked).
    gone_when_missing: bool = False
    # Seconds the server may hold the call on purpose (WaitJob): added to each attempt's
    # timeout.
    holds: float = 0.0


def _whole(response: Out) -> Out:
    return response


def _job(response: Any) -> job_pb2.Job:
    job: job_pb2.Job = response.job
    return job


def _nothing(response: Any) -> None:
    return None


def _device(response: Any) -> notify.Device:
    device: notify.Device = response.device
    return device


def _asset(response: Any) -> asset_pb2.Asset:
    asset: asset_pb2.Asset = response.asset
    return asset


Fields = Mapping[str, Any]


def submit(request: creation.SubmitJobRequest | None, fields: Fields) -> Call[job_pb2.Job]:
    keyed = requests.keyed(creation.SubmitJobRequest, request, fields)
    return Call("creation", "SubmitJob", keyed, True, _job)


def get_job(job_id: str) -> Call[job_pb2.Job]:
    return Call("creation", "GetJob", creation.GetJobRequest(job_id=job_id), True, _job)


# WaitJob's longest timeout.
MAX_WAIT_JOB_SECONDS = 60.0


def wait_job(job_id: str, timeout: float) -> Call[job_pb2.Job]:
    """WaitJob: the job once it settled, or as it is after ``timeout`` seconds (0 to 60)."""
    if not 0 <= timeout <= MAX_WAIT_JOB_SECONDS:
        raise ValueError(f"timeout must be 0 to {MAX_WAIT_JOB_SECONDS:.0f} seconds")
    request = creation.WaitJobRequest(job_id=job_id)
    request.timeout.FromNanoseconds(round(timeout * 1e9))
    return Call("creation", "WaitJob", request, True, _job, holds=timeout)


def list_jobs(
    request: creation.ListJobsRequest | None, fields: Fields
) -> Call[creation.ListJobsResponse]:
    built = requests.build(creation.ListJobsRequest, request, fields)
    return Call("creation", "ListJobs", built, True, _whole)


def cancel_job(job_id: str) -> Call[job_pb2.Job]:
    # Retried: cancelling a cancelled job (or one whose cancel was asked) answers the job
    # as it is, so a replay of a cancel that landed is the same answer.
    return Call("creation", "CancelJob", creation.CancelJobRequest(job_id=job_id), True, _job)


def delete_job(job_id: str, keep_assets: bool) -> Call[None]:
    # Retried: deleting a job the caller already deleted succeeds again.
    request = creation.DeleteJobRequest(job_id=job_id, keep_assets=keep_assets)
    return Call("creation", "DeleteJob", request, True, _nothing)


def list_ledger_entries(
    request: creation.ListLedgerEntriesRequest | None, fields: Fields
) -> Call[creation.ListLedgerEntriesResponse]:
    built = requests.build(creation.ListLedgerEntriesRequest, request, fields)
    return Call("creation", "ListLedgerEntries", built, True, _whole)


def get_balance() -> Call[creation.GetBalanceResponse]:
    return Call("creation", "GetBalance", creation.GetBalanceRequest(), True, _whole)


def list_catalog(
    request: creation.ListCatalogRequest | None, fields: Fields
) -> Call[creation.ListCatalogResponse]:
    built = requests.build(creation.ListCatalogRequest, request, fields)
    return Call("creation", "ListCatalog", built, True, _whole)


def create_upload(
    request: media.CreateUploadRequest | None, fields: Fields
) -> Call[media.CreateUploadResponse]:
    # Retried only once the request carries a request_id (a replay is then the same asset).
    keyed = requests.keyed(media.CreateUploadRequest, request, fields)
    return Call("media", "CreateUpload", keyed, requests.has_request_id(keyed), _whole)


def input_upload(data: bytes, content_type: str) -> Call[media.CreateUploadResponse]:
    """CreateUpload for an input photo of these bytes (their hash checked on completion)."""
    fields = {
        "purpose": asset_pb2.ASSET_PURPOSE_AI_INPUT,
        "content_type": content_type,
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return create_upload(None, fields)


def complete_upload(asset_id: str) -> Call[asset_pb2.Asset]:
    # Not retried: completing a ready asset is refused (UPLOAD_ALREADY_COMPLETED).
    request = media.CompleteUploadRequest(asset_id=asset_id)
    return Call("media", "CompleteUpload", request, False, _asset)


def register_device(
    request: notify.RegisterDeviceRequest | None, fields: Fields
) -> Call[notify.Device]:
    # Retried: registering the same token again returns the same device.
    built = requests.build(notify.RegisterDeviceRequest, request, fields)
    return Call("notify", "RegisterDevice", built, True, _device)


def list_devices(
    request: notify.ListDevicesRequest | None, fields: Fields
) -> Call[notify.ListDevicesResponse]:
    built = requests.build(notify.ListDevicesRequest, request, fields)
    return Call("notify", "ListDevices", built, True, _whole)


def delete_device(device_id: str) -> Call[None]:
    request = notify.DeleteDeviceRequest(device_id=device_id)
    return Call("notify", "DeleteDevice", request, True, _nothing, gone_when_missing=True)


def register_live_activity(
    request: notify.RegisterLiveActivityRequest | None, fields: Fields
) -> Call[notify.RegisterLiveActivityResponse]:
    # Retried: registering the same token under the same activity again is harmless.
    built = requests.build(notify.RegisterLiveActivityRequest, request, fields)
    return Call("notify", "RegisterLiveActivity", built, True, _whole)


def delete_live_activity(job_id: str, activity_id: str) -> Call[None]:
    request = notify.DeleteLiveActivityRequest(job_id=job_id, activity_id=activity_id)
    return Call("notify", "DeleteLiveActivity", request, True, _nothing, gone_when_missing=True)
