"""MediaService (public): clients upload their input photos and read their own assets.
Thin: check the fields, ask :class:`services.media.assets.Assets`, answer in protobuf."""

from __future__ import annotations

from typing import Any

from grpc import aio

from atelier.media.v1 import media_service_pb2, media_service_pb2_grpc
from services.kit.auth import current_principal
from services.kit.idempotency import header_key
from services.kit.timestamps import set_timestamp, to_timestamp
from services.media import fields
from services.media.assets import Assets
from services.media.convert import asset_message


class MediaServicer(media_service_pb2_grpc.MediaServiceServicer):
    def __init__(self, assets: Assets, max_upload_bytes: int) -> None:
        self._assets = assets
        self._max_upload_bytes = max_upload_bytes

    async def CreateUpload(
        self,
        request: media_service_pb2.CreateUploadRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> media_service_pb2.CreateUploadResponse:
        fields.upload_purpose(request.purpose)
        content_type = fields.content_type(request.content_type, "content_type")
        size_bytes = fields.size_bytes(request.size_bytes, self._max_upload_bytes)
        sha256 = fields.sha256(request.sha256)
        request_id = fields.request_id(request.request_id, header_key(context))
        upload = await self._assets.create_upload(
            current_principal().user_id, content_type, size_bytes, sha256, request_id
        )
        return media_service_pb2.CreateUploadResponse(
            asset=asset_message(upload.asset),
            upload_url=upload.request.url,
            upload_method=upload.request.method,
            upload_headers=upload.request.headers,
            expire_time=to_timestamp(upload.expires_at),
        )

    async def CompleteUpload(
        self,
        request: media_service_pb2.CompleteUploadRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> media_service_pb2.CompleteUploadResponse:
        asset_id = fields.asset_id(request.asset_id)
        asset = await self._assets.complete_upload(current_principal().user_id, asset_id)
        return media_service_pb2.CompleteUploadResponse(asset=asset_message(asset))

    async def GetAsset(
        self,
        request: media_service_pb2.GetAssetRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> media_service_pb2.GetAssetResponse:
        asset_id = fields.asset_id(request.asset_id)
        found = await self._assets.get_owned(current_principal().user_id, asset_id)
        reply = media_service_pb2.GetAssetResponse(asset=asset_message(found.asset))
        if found.request is not None and found.expires_at is not None:
            reply.download_url = found.request.url
            set_timestamp(reply.download_url_expire_time, found.expires_at)
            if found.thumbnail is not None:
                reply.thumbnail_url = found.thumbnail.url
                set_timestamp(reply.thumbnail_url_expire_time, found.expires_at)
        return reply
