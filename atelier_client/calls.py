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
from atelier_client import requests

Out = TypeVar("Out")
Service = Literal["creation", "media"]


@dataclass(frozen=True, slots=True)
class Call(Generic[Out]):
    service: Service
    method: str
    request: Message
    # A read, or a write the server recognises when replayed (it carries a request_id).
    retryable: bool
    unwrap: Callable[[Any], Out]


def _whole(response: Out) -> Out:
    return response


def _job(response: Any) -> job_pb2.Job:
    job: job_pb2.Job = response.job
    return job


def _asset(response: Any) -> asset_pb2.Asset:
    asset: asset_pb2.Asset = response.asset
    return asset


Fields = Mapping[str, Any]


def submit(request: creation.SubmitJobRequest | None, fields: Fields) -> Call[job_pb2.Job]:
    keyed = requests.keyed(creation.SubmitJobRequest, request, fields)
    return Call("creation", "SubmitJob", keyed, True, _job)


def get_job(job_id: str) -> Call[job_pb2.Job]:
    return Call("creation", "GetJob", creation.GetJobRequest(job_id=job_id), True, _job)


def list_jobs(
    request: creation.ListJobsRequest | None, fields: Fields
) -> Call[creation.ListJobsResponse]:
    built = requests.build(creation.ListJobsRequest, request, fields)
    return Call("creation", "ListJobs", built, True, _whole)


def cancel_job(job_id: str) -> Call[job_pb2.Job]:
    # Not retried: a replay of a cancel that landed is refused (JOB_ALREADY_FINISHED).
    return Call("creation", "CancelJob", creation.CancelJobRequest(job_id=job_id), False, _job)


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
