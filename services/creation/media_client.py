"""creation's view of media, over media's internal gRPC listener."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import grpc

from atelier.media.v1 import asset_pb2, media_internal_service_pb2, media_internal_service_pb2_grpc
from services.creation.errors import MediaUnavailable
from services.kit.logging import get_logger

log = get_logger(__name__)

CALL_TIMEOUT_SECONDS = 3.0
_PURPOSES = {
    asset_pb2.ASSET_PURPOSE_AI_INPUT: "ai_input",
    asset_pb2.ASSET_PURPOSE_AI_OUTPUT: "ai_output",
}
_STATUSES = {
    asset_pb2.ASSET_STATUS_UPLOADING: "uploading",
    asset_pb2.ASSET_STATUS_READY: "ready",
    asset_pb2.ASSET_STATUS_DELETED: "deleted",
}


@dataclass(frozen=True)
class AssetInfo:
    asset_id: str
    owner_user_id: str
    purpose: str
    status: str


@dataclass(frozen=True)
class DownloadUrl:
    url: str
    expires_at: datetime


class MediaClient:
    def __init__(self, address: str, service_token: str) -> None:
        self._address = address
        self._metadata = (("authorization", f"Bearer {service_token}"),)
        # Opened on first use: a grpc.aio channel belongs to the event loop that made it,
        # and the service is assembled before its loop starts.
        self._channel: grpc.aio.Channel | None = None
        self._stub_instance: (
            media_internal_service_pb2_grpc.MediaInternalServiceAsyncStub | None
        ) = None

    @property
    def _stub(self) -> media_internal_service_pb2_grpc.MediaInternalServiceAsyncStub:
        if self._stub_instance is None:
            self._channel = grpc.aio.insecure_channel(self._address)
            self._stub_instance = media_internal_service_pb2_grpc.MediaInternalServiceStub(
                self._channel
            )
        return self._stub_instance

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)

    async def asset_info(self, asset_id: str) -> AssetInfo | None:
        """The asset's metadata; None when media knows no such asset."""
        try:
            reply = await self._stub.GetAssetInfo(
                media_internal_service_pb2.GetAssetInfoRequest(asset_id=asset_id),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            # A malformed id is as unknown as a missing one.
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return None
            log.warning("media_call_failed", call="GetAssetInfo", code=error.code().name)
            raise MediaUnavailable() from None
        asset = reply.asset
        return AssetInfo(
            asset_id=asset.asset_id,
            owner_user_id=asset.owner_user_id,
            purpose=_PURPOSES.get(asset.purpose, "unknown"),
            status=_STATUSES.get(asset.status, "unknown"),
        )

    async def download_url(self, asset_id: str) -> DownloadUrl | None:
        """A fresh download URL; None when media cannot give one (logged, not raised: a
        job is still worth showing without its picture)."""
        try:
            reply = await self._stub.GetAssetUrl(
                media_internal_service_pb2.GetAssetUrlRequest(asset_id=asset_id),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            log.warning("media_call_failed", call="GetAssetUrl", code=error.code().name)
            return None
        return DownloadUrl(reply.download_url, reply.expire_time.ToDatetime(tzinfo=UTC))
