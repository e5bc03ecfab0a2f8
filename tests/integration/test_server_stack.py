"""The server stack is applied when servicers register, not by interceptors on each call:
so every method of every service, on both listeners, must still refuse a caller without
credentials — before its request is even parsed — while health answers anyone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
)
from atelier.media.v1 import (
    media_internal_service_pb2,
    media_internal_service_pb2_grpc,
    media_service_pb2,
    media_service_pb2_grpc,
)
from atelier.notify.v1 import (
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2,
    notify_service_pb2_grpc,
)
from services.kit.server import Binding, RunningService, ServiceApp, placeholder
from services.kit.settings import CommonSettings, EnvReader, ListenSettings
from tests.support.rpc import error_info


def binding(module: Any, pb2: Any, name: str) -> Binding:
    return Binding(
        pb2.DESCRIPTOR.services_by_name[name],
        getattr(module, f"add_{name}Servicer_to_server"),
        placeholder(getattr(module, f"{name}Servicer")),
    )


PUBLIC = [
    binding(creation_service_pb2_grpc, creation_service_pb2, "CreationService"),
    binding(media_service_pb2_grpc, media_service_pb2, "MediaService"),
    binding(notify_service_pb2_grpc, notify_service_pb2, "NotifyService"),
]
INTERNAL = [
    binding(admin_service_pb2_grpc, admin_service_pb2, "AdminService"),
    binding(media_internal_service_pb2_grpc, media_internal_service_pb2, "MediaInternalService"),
    binding(notify_ingest_service_pb2_grpc, notify_ingest_service_pb2, "NotifyIngestService"),
]


@pytest.fixture
async def running() -> AsyncIterator[RunningService]:
    app = ServiceApp(name="stack-test", public=PUBLIC, internal=INTERNAL)
    service = RunningService(
        app, CommonSettings.read(EnvReader({"ATELIER_DRAIN_GRACE": "0"})), ListenSettings(0, 0, 0)
    )
    await service.start()
    yield service
    await service.stop()


def methods(bindings: list[Binding]) -> list[tuple[ServiceDescriptor, MethodDescriptor]]:
    return [(b.descriptor, m) for b in bindings for m in b.descriptor.methods]


async def call_without_credentials(
    channel: grpc.aio.Channel, service: ServiceDescriptor, method: MethodDescriptor
) -> grpc.aio.AioRpcError:
    """Calls ``method`` with bytes that parse as no request message, and no metadata."""
    path = f"/{service.full_name}/{method.name}"
    garbage = b"\xff\xff\xff"
    try:
        if method.client_streaming and method.server_streaming:
            async for _ in channel.stream_stream(path)(iter([garbage])):  # type: ignore[call-arg]
                pass
        elif method.client_streaming:
            await channel.stream_unary(path)(iter([garbage]))  # type: ignore[call-arg]
        elif method.server_streaming:
            async for _ in channel.unary_stream(path)(garbage):  # type: ignore[call-arg]
                pass
        else:
            await channel.unary_unary(path)(garbage)  # type: ignore[call-arg]
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError(f"{path} answered a caller without credentials")


@pytest.mark.parametrize(
    ("port_of", "bindings", "reason"),
    [
        (lambda s: s.public_port, PUBLIC, "TOKEN_MISSING"),
        (lambda s: s.internal_port, INTERNAL, "SERVICE_CREDENTIAL_MISSING"),
    ],
    ids=["public", "internal"],
)
async def test_every_method_refuses_a_caller_without_credentials(
    running: RunningService,
    port_of: Callable[[RunningService], int],
    bindings: list[Binding],
    reason: str,
) -> None:
    checked = methods(bindings)
    assert len(checked) > len(bindings)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port_of(running)}") as channel:
        for service, method in checked:
            error = await call_without_credentials(channel, service, method)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, method.full_name
            assert error_info(error).reason == reason, method.full_name


async def test_health_answers_without_credentials(running: RunningService) -> None:
    for port in (running.public_port, running.internal_port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
