"""Assets as protobuf messages."""

from __future__ import annotations

from atelier.media.v1 import asset_pb2, media_internal_service_pb2
from services.kit.timestamps import set_timestamp, to_timestamp
from services.media.assets import SignedUrls
from services.media.domain import Asset, Purpose, Status

_PURPOSES = {
    Purpose.AI_INPUT: asset_pb2.ASSET_PURPOSE_AI_INPUT,
    Purpose.AI_OUTPUT: asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
}
_STATUSES = {
    Status.UPLOADING: asset_pb2.ASSET_STATUS_UPLOADING,
    Status.READY: asset_pb2.ASSET_STATUS_READY,
    Status.DELETED: asset_pb2.ASSET_STATUS_DELETED,
}


def asset_message(asset: Asset) -> asset_pb2.Asset:
    message = asset_pb2.Asset(
        asset_id=str(asset.asset_id),
        owner_user_id=asset.owner_user_id,
        purpose=_PURPOSES[asset.purpose],
        status=_STATUSES[asset.status],
        content_type=asset.content_type,
        # The measured size once known, the declared one while uploading.
        size_bytes=asset.size_bytes or asset.declared_size_bytes or 0,
        sha256=asset.sha256 or "",
        width=asset.width or 0,
        height=asset.height or 0,
        create_time=to_timestamp(asset.created_at),
    )
    if asset.ready_at is not None:
        set_timestamp(message.ready_time, asset.ready_at)
    return message


def asset_urls_message(signed: SignedUrls) -> media_internal_service_pb2.AssetUrls:
    expire_time = to_timestamp(signed.expires_at)
    message = media_internal_service_pb2.AssetUrls(
        asset_id=str(signed.asset_id),
        url=signed.request.url,
        url_expire_time=expire_time,
        width=signed.width,
        height=signed.height,
        content_type=signed.content_type,
        size_bytes=signed.size_bytes,
    )
    if signed.window_ends_at is not None:
        set_timestamp(message.window_end_time, signed.window_ends_at)
    if signed.thumbnail is not None:
        message.thumbnail_url = signed.thumbnail.url
        message.thumbnail_url_expire_time.CopyFrom(expire_time)
    return message
