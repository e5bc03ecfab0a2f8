"""CreationService: thin translation between protobuf and the catalog and job logic."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from grpc import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import catalog_pb2, creation_service_pb2, creation_service_pb2_grpc
from services.creation import convert, submission
from services.creation.errors import (
    InputAssetNotFound,
    InputAssetNotReady,
    InvalidRequest,
    Reason,
)
from services.creation.media_client import MediaClient
from services.creation.store import catalog as catalog_store
from services.creation.store import jobs as job_store
from services.creation.store import ledger
from services.kit.auth import current_principal
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.pagination import decode_token, encode_token, invalid_page_token, page_size

_KIND_TO_PROTO = {
    "image": catalog_pb2.MEDIA_KIND_IMAGE,
    "video": catalog_pb2.MEDIA_KIND_VIDEO,
}
_KIND_FROM_PROTO = {value: key for key, value in _KIND_TO_PROTO.items()}
Context = aio.ServicerContext[Any, Any]


def _metadata_value(context: Context, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value.decode() if isinstance(value, bytes) else value
    return None


def _job_id(value: str) -> str:
    if not submission.is_uuid(value):
        raise invalid_argument(Reason.INVALID_JOB_ID, [FieldViolation("job_id", "must be a UUID")])
    return value.lower()


class CreationServicer(creation_service_pb2_grpc.CreationServiceServicer):
    def __init__(
        self,
        engine: AsyncEngine,
        media: MediaClient,
        limits: job_store.SubmitLimits,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        catalog: catalog_store.CachedCatalog | None = None,
    ) -> None:
        self._engine = engine
        self._catalog = catalog or catalog_store.CachedCatalog(engine, ttl_seconds=0)
        self._media = media
        self._limits = limits
        self._clock = clock

    async def ListCatalog(
        self, request: creation_service_pb2.ListCatalogRequest, context: Context
    ) -> creation_service_pb2.ListCatalogResponse:
        # An unknown enum number (newer client) filters to nothing rather than failing.
        kind = _KIND_FROM_PROTO.get(request.media_kind, "unknown") if request.media_kind else None
        catalog = await self._catalog.enabled(kind)
        return creation_service_pb2.ListCatalogResponse(
            models=[
                catalog_pb2.Model(
                    model_id=m.model_id,
                    display_name=m.display_name,
                    description=m.description,
                    media_kind=_KIND_TO_PROTO[m.media_kind],
                    price_points=m.price_points,
                    sort_order=m.sort_order,
                )
                for m in catalog.models
            ],
            styles=[
                catalog_pb2.Style(
                    style_id=s.style_id,
                    display_name=s.display_name,
                    description=s.description,
                    media_kind=_KIND_TO_PROTO[s.media_kind],
                    sort_order=s.sort_order,
                )
                for s in catalog.styles
            ],
        )

    async def SubmitJob(
        self, request: creation_service_pb2.SubmitJobRequest, context: Context
    ) -> creation_service_pb2.SubmitJobResponse:
        user_id = current_principal().user_id
        key, key_problems = submission.choose_idempotency_key(
            request.request_id, _metadata_value(context, "idempotency-key")
        )
        command, problems = submission.validate(
            idempotency_key=key,
            model_id=request.model_id,
            style_id=request.style_id,
            input_asset_id=request.input_asset_id,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            width=request.width,
            height=request.height,
            parameters=convert.struct_to_dict(request.parameters),
        )
        if key_problems or command is None:
            raise invalid_argument(Reason.INVALID_JOB_REQUEST, [*key_problems, *problems])
        submitted = await job_store.find_replay(self._engine, user_id, command)
        if submitted is None:
            await self._check_input_asset(user_id, command.input_asset_id)
            submitted = await job_store.submit(
                self._engine, user_id, command, self._limits, self._clock()
            )
        return creation_service_pb2.SubmitJobResponse(job=convert.job_message(submitted.job))

    async def _check_input_asset(self, user_id: str, asset_id: str) -> None:
        info = await self._media.asset_info(asset_id)
        if info is None or info.owner_user_id != user_id or info.status == "deleted":
            raise InputAssetNotFound()
        if info.purpose != "ai_input":
            raise InvalidRequest(
                Reason.INPUT_ASSET_WRONG_PURPOSE, "input_asset_id", "is not an uploaded input photo"
            )
        if info.status != "ready":
            raise InputAssetNotReady()

    async def GetJob(
        self, request: creation_service_pb2.GetJobRequest, context: Context
    ) -> creation_service_pb2.GetJobResponse:
        job = await job_store.get(
            self._engine, current_principal().user_id, _job_id(request.job_id)
        )
        message = convert.job_message(job)
        if job.output_asset_id is not None:
            link = await self._media.download_url(job.output_asset_id)
            if link is not None:
                message.output_url = link.url
                message.output_url_expire_time.FromDatetime(link.expires_at)
        return creation_service_pb2.GetJobResponse(job=message)

    async def ListJobs(
        self, request: creation_service_pb2.ListJobsRequest, context: Context
    ) -> creation_service_pb2.ListJobsResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        status = convert.STATUS_FROM_PROTO.get(request.status) if request.status else None
        if request.status and status is None:
            raise invalid_argument(
                Reason.INVALID_JOB_REQUEST, [FieldViolation("status", "is not a job status")]
            )
        after = None
        if request.page_token:
            position = decode_token(request.page_token, ("t", "j", "s"))
            if position["s"] != (status.value if status else ""):
                raise invalid_page_token("was issued for another status filter")
            after = _cursor(position)
        found, next_cursor = await job_store.list_for_user(
            self._engine, current_principal().user_id, status, limit, after
        )
        token = ""
        if next_cursor is not None:
            token = encode_token(
                {
                    "t": next_cursor.created_at.isoformat(),
                    "j": next_cursor.job_id,
                    "s": status.value if status else "",
                }
            )
        return creation_service_pb2.ListJobsResponse(
            jobs=[convert.job_message(j) for j in found], next_page_token=token
        )

    async def CancelJob(
        self, request: creation_service_pb2.CancelJobRequest, context: Context
    ) -> creation_service_pb2.CancelJobResponse:
        job = await job_store.cancel(
            self._engine, current_principal().user_id, _job_id(request.job_id), self._clock()
        )
        return creation_service_pb2.CancelJobResponse(job=convert.job_message(job))

    async def GetBalance(
        self, request: creation_service_pb2.GetBalanceRequest, context: Context
    ) -> creation_service_pb2.GetBalanceResponse:
        balance = await ledger.read_balance(
            self._engine, current_principal().user_id, self._limits.welcome_points, self._clock()
        )
        return creation_service_pb2.GetBalanceResponse(
            available_points=balance.available, reserved_points=balance.reserved
        )


def _cursor(position: dict[str, Any]) -> job_store.Cursor:
    try:
        created_at = datetime.fromisoformat(str(position["t"]))
    except ValueError:
        raise invalid_page_token() from None
    if created_at.tzinfo is None or not submission.is_uuid(str(position["j"])):
        raise invalid_page_token()
    return job_store.Cursor(created_at, str(position["j"]))
