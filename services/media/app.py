"""Assembles the media service. Asset RPCs answer UNIMPLEMENTED until the media issue."""

from __future__ import annotations

from atelier.media.v1 import (
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, placeholder, run_service
from services.media.settings import MediaSettings


def build(settings: MediaSettings) -> ServiceApp:
    database = Database(settings.common.database_url, application_name="atelier-media")
    return ServiceApp(
        name="media",
        public=[
            Binding(
                media_service_pb2.DESCRIPTOR.services_by_name["MediaService"],
                media_service_pb2_grpc.add_MediaServiceServicer_to_server,
                placeholder(media_service_pb2_grpc.MediaServiceServicer),
            )
        ],
        internal=[
            Binding(
                media_internal_service_pb2.DESCRIPTOR.services_by_name["MediaInternalService"],
                media_internal_service_pb2_grpc.add_MediaInternalServiceServicer_to_server,
                placeholder(media_internal_service_pb2_grpc.MediaInternalServiceServicer),
            )
        ],
        readiness=database.answers,
        cleanup=[database.close],
    )


def main() -> int:
    settings = MediaSettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
