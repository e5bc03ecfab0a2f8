"""Assembles the notify service. Streams, devices and ingest answer UNIMPLEMENTED until
the notify issue."""

from __future__ import annotations

from atelier.notify.v1 import (
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2,
    notify_service_pb2_grpc,
)
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, placeholder, run_service
from services.notify.settings import NotifySettings


def build(settings: NotifySettings) -> ServiceApp:
    database = Database(
        settings.common.database_url, "atelier-notify", limits=settings.common.database
    )
    return ServiceApp(
        name="notify",
        public=[
            Binding(
                notify_service_pb2.DESCRIPTOR.services_by_name["NotifyService"],
                notify_service_pb2_grpc.add_NotifyServiceServicer_to_server,
                placeholder(notify_service_pb2_grpc.NotifyServiceServicer),
            )
        ],
        internal=[
            Binding(
                notify_ingest_service_pb2.DESCRIPTOR.services_by_name["NotifyIngestService"],
                notify_ingest_service_pb2_grpc.add_NotifyIngestServiceServicer_to_server,
                placeholder(notify_ingest_service_pb2_grpc.NotifyIngestServiceServicer),
            )
        ],
        readiness=database.answers,
        cleanup=[database.close],
    )


def main() -> int:
    settings = NotifySettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
