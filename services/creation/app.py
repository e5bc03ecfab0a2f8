"""Assembles the creation service: servicers, database, readiness."""

from __future__ import annotations

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
)
from services.creation.servicer import CreationServicer
from services.creation.settings import CreationSettings
from services.kit.db import Database
from services.kit.server import Binding, ServiceApp, placeholder, run_service


def build(settings: CreationSettings) -> ServiceApp:
    database = Database(settings.common.database_url, application_name="atelier-creation")
    return ServiceApp(
        name="creation",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                # Job RPCs arrive with the jobs issue; until then the generated base answers
                # UNIMPLEMENTED for them.
                CreationServicer(database.engine),  # type: ignore[abstract]
            )
        ],
        internal=[
            Binding(
                admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"],
                admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
                placeholder(admin_service_pb2_grpc.AdminServiceServicer),
            )
        ],
        readiness=database.answers,
        cleanup=[database.close],
    )


def main() -> int:
    settings = CreationSettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
