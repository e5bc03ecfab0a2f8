"""Assembles the notify service: the ingest listener (creation's relay delivers job states
to the projection, and what moved goes to the publisher). Streams and devices answer
UNIMPLEMENTED until they are built."""

from __future__ import annotations

from atelier.notify.v1 import (
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2,
    notify_service_pb2_grpc,
)
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, placeholder, run_service
from services.notify.fanout import InProcessPublisher, Publisher
from services.notify.ingest_servicer import NotifyIngestServicer
from services.notify.settings import NotifySettings


def build(settings: NotifySettings, publisher: Publisher | None = None) -> ServiceApp:
    """``publisher`` receives what each Deliver moved; by default this process's own
    subscribers."""
    publisher = publisher if publisher is not None else InProcessPublisher()
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
                NotifyIngestServicer(database.engine, publisher),
            )
        ],
        readiness=database.answers,
        cleanup=[database.close],
    )


def main() -> int:
    settings = NotifySettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
