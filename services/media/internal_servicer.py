"""MediaInternalService: asset access for our own services (workers, providers, creation).
Only on the internal listener, behind the service credential; no owner checks here."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from google.rpc import status_pb2
from grpc import aio

from atelier.media.v1 import asset_pb2, media_internal_service_pb2_grpc
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.kit.batches import answer_each, batch_size
from services.kit.timestamps import set_timestamp
from services.media import fields
from services.media.assets import MAX_URL_BATCH, Assets
from services.media.convert import asset_message, asset_urls_message
from services.media.errors import ImportRefused, Reason
from services.media.imports import Importer

# ReserveOutputUploads and CompleteOutputUploads take at most this many items a call.
MAX_OUTPUT_BATCH = 100


class MediaInternalServicer(media_internal_service_pb2_grpc.MediaInternalServiceServicer):
    def __init__(
        self, assets: Assets, max_upload_bytes: int, importer: Importer | None = None
    ) -> None:
        self._assets = assets
        self._max_upload_bytes = max_upload_bytes
        self._importer = importer

    async def PutAsset(
        self,
        request_iterator: AsyncIterable[pb.PutAssetRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> pb.PutAssetResponse:
        messages = aiter(request_iterator)
        header = fields.put_header(await anext(messages, None))
        owner = fields.owner_user_id(header.owner_user_id, "header.owner_user_id")
        purpose = fields.any_purpose(header.purpose, "header.purpose")
        content_type = fields.content_type(header.content_type, "header.content_type")
        key = fields.idempotency_key(header.idempotency_key, "header.idempotency_key")

        async def chunks() -> AsyncIterator[bytes]:
            async for message in messages:
                yield fields.put_chunk(message)

        asset = await self._assets.put(owner, purpose, content_type, chunks(), key)
        return pb.PutAssetResponse(asset=asset_message(asset))

    async def ReadAsset(
        self, request: pb.ReadAssetRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ReadAssetResponse]:
        asset, chunks = await self._assets.read(fields.asset_id(request.asset_id))
        yield pb.ReadAssetResponse(asset=asset_message(asset))
        async for chunk in chunks:
            yield pb.ReadAssetResponse(chunk=chunk)

    async def GetAssetUrl(
        self, request: pb.GetAssetUrlRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.GetAssetUrlResponse:
        found = await self._assets.download_url(fields.asset_id(request.asset_id))
        reply = pb.GetAssetUrlResponse(asset=asset_message(found.asset))
        if found.request is not None and found.expires_at is not None:
            reply.download_url = found.request.url
            set_timestamp(reply.expire_time, found.expires_at)
            if found.thumbnail is not None:
                reply.thumbnail_url = found.thumbnail.url
                set_timestamp(reply.thumbnail_url_expire_time, found.expires_at)
        return reply

    async def GetAssetUrls(
        self, request: pb.GetAssetUrlsRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.GetAssetUrlsResponse:
        ids = fields.asset_ids(request.asset_ids, "asset_ids", MAX_URL_BATCH)
        signed = await self._assets.download_urls(ids)
        return pb.GetAssetUrlsResponse(assets=[asset_urls_message(s) for s in signed])

    async def GetAssetInfo(
        self, request: pb.GetAssetInfoRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.GetAssetInfoResponse:
        asset = await self._assets.info(fields.asset_id(request.asset_id))
        return pb.GetAssetInfoResponse(asset=asset_message(asset))

    async def ReserveOutputUpload(
        self, request: pb.ReserveOutputUploadRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ReserveOutputUploadResponse:
        return await self._reserve_output(request)

    async def ReserveOutputUploads(
        self, request: pb.ReserveOutputUploadsRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ReserveOutputUploadsResponse:
        batch_size(len(request.requests), "requests", MAX_OUTPUT_BATCH, Reason.INVALID_BATCH)
        answers = await answer_each(request.requests, self._reserve_output, "ReserveOutputUploads")
        return pb.ReserveOutputUploadsResponse(
            results=[
                pb.ReserveOutputUploadResult(error=answer)
                if isinstance(answer, status_pb2.Status)
                else pb.ReserveOutputUploadResult(reservation=answer)
                for answer in answers
            ]
        )

    async def CompleteOutputUpload(
        self, request: pb.CompleteOutputUploadRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.CompleteOutputUploadResponse:
        return pb.CompleteOutputUploadResponse(asset=await self._complete_output(request))

    async def CompleteOutputUploads(
        self, request: pb.CompleteOutputUploadsRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.CompleteOutputUploadsResponse:
        batch_size(len(request.requests), "requests", MAX_OUTPUT_BATCH, Reason.INVALID_BATCH)
        answers = await answer_each(
            request.requests, self._complete_output, "CompleteOutputUploads"
        )
        return pb.CompleteOutputUploadsResponse(
            results=[
                pb.CompleteOutputUploadResult(error=answer)
                if isinstance(answer, status_pb2.Status)
                else pb.CompleteOutputUploadResult(asset=answer)
                for answer in answers
            ]
        )

    async def _reserve_output(
        self, request: pb.ReserveOutputUploadRequest
    ) -> pb.ReserveOutputUploadResponse:
        owner = fields.owner_user_id(request.owner_user_id, "owner_user_id")
        content_type = fields.content_type(request.content_type, "content_type")
        size_bytes = fields.size_bytes(request.size_bytes, self._max_upload_bytes)
        sha256 = fields.required_sha256(request.sha256)
        key = fields.required_idempotency_key(request.idempotency_key, "idempotency_key")
        reserved = await self._assets.reserve_output(owner, content_type, size_bytes, sha256, key)
        reply = pb.ReserveOutputUploadResponse(asset=asset_message(reserved.asset))
        if reserved.request is not None and reserved.expires_at is not None:
            reply.upload_url = reserved.request.url
            reply.upload_method = reserved.request.method
            reply.upload_headers.update(reserved.request.headers)
            set_timestamp(reply.expire_time, reserved.expires_at)
        return reply

    async def _complete_output(self, request: pb.CompleteOutputUploadRequest) -> asset_pb2.Asset:
        asset_id = fields.asset_id(request.asset_id)
        owner = fields.owner_user_id(request.owner_user_id, "owner_user_id")
        key = fields.required_idempotency_key(request.idempotency_key, "idempotency_key")
        return asset_message(await self._assets.complete_output(owner, asset_id, key))

    async def ImportAsset(
        self, request: pb.ImportAssetRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ImportAssetResponse:
        owner = fields.owner_user_id(request.owner_user_id, "owner_user_id")
        key = fields.idempotency_key(request.idempotency_key, "idempotency_key")
        if self._importer is None:
            raise ImportRefused("IMPORTS_OFF", "this server imports no URLs")
        asset = await self._importer.import_url(owner, request.url, key)
        return pb.ImportAssetResponse(asset=asset_message(asset))

    async def DeleteAsset(
        self, request: pb.DeleteAssetRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.DeleteAssetResponse:
        asset = await self._assets.delete(fields.asset_id(request.asset_id))
        return pb.DeleteAssetResponse(asset=asset_message(asset))

    async def DeleteKeyedAssets(
        self, request: pb.DeleteKeyedAssetsRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.DeleteKeyedAssetsResponse:
        owner = fields.owner_user_id(request.owner_user_id, "owner_user_id")
        keys = fields.idempotency_keys(request.idempotency_keys, "idempotency_keys")
        deleted = await self._assets.delete_keyed(owner, keys)
        return pb.DeleteKeyedAssetsResponse(assets=[asset_message(a) for a in deleted])
