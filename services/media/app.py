"""Assembles the media service: storage backend, asset operations, both servicers,
housekeeping, the thumbnail maker and, for the local backend, the HTTP listener that
serves signed URLs."""

from __future__ import annotations

from datetime import timedelta

from atelier.media.v1 import (
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from services.kit.components import Component, TaskComponent
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, run_service
from services.media.assets import Assets, Clock, Limits, utc_now
from services.media.housekeeping import Housekeeper
from services.media.http import ObjectHttpServer
from services.media.images import ImageInspector
from services.media.imports import AddressPolicy, FetchLimits, Importer, UrlFetcher, import_tls
from services.media.internal_servicer import MediaInternalServicer
from services.media.key_statuses import KeyStatuses
from services.media.servicer import MediaServicer
from services.media.settings import MediaSettings
from services.media.storage import DownloadWindows, ObjectStorage
from services.media.storage.local import LocalStorage
from services.media.storage.s3 import S3Storage
from services.media.storage.signing import UrlSigner
from services.media.store.assets import AssetStore
from services.media.thumbnail_backfill import ThumbnailBackfill
from services.media.thumbnail_queue import ThumbnailQueue
from services.media.thumbnails import Thumbnailer


def download_windows(settings: MediaSettings) -> DownloadWindows:
    return DownloadWindows(settings.download_url_window_seconds, settings.download_url_ttl_seconds)


def open_storage(settings: MediaSettings) -> ObjectStorage:
    cache_control = download_windows(settings).cache_control
    if settings.storage_backend == "s3":
        return S3Storage(settings.s3, cache_control=cache_control)
    return LocalStorage(
        settings.local_dir,
        UrlSigner(settings.url_secret, settings.public_base_url),
        cache_control,
    )


def build(
    settings: MediaSettings, storage: ObjectStorage | None = None, clock: Clock = utc_now
) -> ServiceApp:
    """``storage`` overrides the configured backend and ``clock`` the time (tests)."""
    database = Database(
        settings.common.database_url, "atelier-media", limits=settings.common.database
    )
    storage = storage or open_storage(settings)
    store = AssetStore(database.engine)
    # Its slots bound the decodes in memory at once.
    thumbnailer = Thumbnailer(settings.max_image_pixels)
    thumbnails = ThumbnailQueue(
        ThumbnailBackfill(
            store,
            storage,
            thumbnailer,
            batch=settings.thumbnail_backfill_batch,
            chunk_bytes=settings.chunk_bytes,
        ),
        clock,
        settings.thumbnail_poll_seconds,
    )
    assets = Assets(
        store,
        storage,
        ImageInspector(settings.max_image_pixels),
        Limits(
            upload_url_ttl_seconds=settings.upload_url_ttl_seconds,
            download_url_ttl_seconds=settings.download_url_ttl_seconds,
            download_url_window_seconds=settings.download_url_window_seconds,
            max_upload_bytes=settings.max_upload_bytes,
            chunk_bytes=settings.chunk_bytes,
        ),
        clock,
        on_output_ready=thumbnails.wake,
    )
    housekeeper = Housekeeper(
        store,
        storage,
        period_seconds=settings.housekeeping_period_seconds,
        batch_size=settings.housekeeping_batch,
        abandoned_write_age=timedelta(seconds=settings.abandoned_write_age_seconds),
        clock=clock,
    )
    importer = Importer(
        assets,
        store,
        UrlFetcher(
            AddressPolicy.allowing(settings.import_allowed_networks),
            FetchLimits(
                max_bytes=settings.max_upload_bytes,
                timeout_seconds=settings.import_timeout_seconds,
            ),
            import_tls(settings.import_ca_file),
        ),
        settings.chunk_bytes,
    )
    components: list[Component] = [TaskComponent("housekeeping", housekeeper.housekeeping_loop)]
    if settings.thumbnail_backfill_batch > 0:  # 0: thumbnails are off
        components.append(TaskComponent("thumbnails", thumbnails.make_thumbnails))
    if isinstance(storage, LocalStorage):
        objects = ObjectHttpServer(
            storage, settings.common.host, settings.http_port, rows=KeyStatuses(store)
        )
        components.append(TaskComponent("object_http", objects.serve_objects))
    return ServiceApp(
        name="media",
        public=[
            Binding(
                media_service_pb2.DESCRIPTOR.services_by_name["MediaService"],
                media_service_pb2_grpc.add_MediaServiceServicer_to_server,
                MediaServicer(assets, settings.max_upload_bytes),
            )
        ],
        internal=[
            Binding(
                media_internal_service_pb2.DESCRIPTOR.services_by_name["MediaInternalService"],
                media_internal_service_pb2_grpc.add_MediaInternalServiceServicer_to_server,
                MediaInternalServicer(assets, settings.max_upload_bytes, importer),
            )
        ],
        readiness=database.answers,
        components=components,
        cleanup=[storage.close, database.close],
    )


def main() -> int:
    settings = MediaSettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
