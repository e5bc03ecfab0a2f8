"""Assembles the creation service: servicers, database, media client, readiness."""

from __future__ import annotations

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
)
from services.creation.admin_servicer import AdminServicer
from services.creation.media_client import MediaClient
from services.creation.servicer import CreationServicer
from services.creation.settings import CreationSettings
from services.creation.store.catalog import CachedCatalog
from services.creation.store.jobs import SubmitLimits
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, run_service


def build(settings: CreationSettings) -> ServiceApp:
    database = Database(settings.common.database_url, application_name="atelier-creation")
    media = MediaClient(settings.media_internal_address, settings.common.service_token)
    limits = SubmitLimits(
        daily_quota=settings.daily_quota,
        in_flight_limit=settings.in_flight_limit,
        max_attempts=settings.max_attempts,
        welcome_points=settings.welcome_points,
    )
    return ServiceApp(
        name="creation",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                CreationServicer(
                    database.engine,
                    media,
                    limits,
                    catalog=CachedCatalog(database.engine, settings.catalog_ttl_seconds),
                ),
            )
        ],
        internal=[
            Binding(
                admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"],
                admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
                AdminServicer(database.engine),
            )
        ],
        readiness=database.answers,
        cleanup=[media.close, database.close],
    )


def main() -> int:
    settings = CreationSettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
