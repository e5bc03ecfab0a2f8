"""The kit's TLS listener on a real grpc.aio server and real TLS channels, with
certificates from authorities the test makes: it serves only its bindings and health
(no reflection), every call but health needs the listener's credential, and a certificate
replaced on disk is used from the next connection on, without a restart (a half-done
replacement keeps the one in use)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from services.kit.auth import WorkerPoolAuthenticator, credential_hash, current_principal
from services.kit.server import Binding, RunningService, ServiceApp, TlsListener, placeholder
from services.kit.settings import CommonSettings, EnvReader, ListenSettings
from services.kit.tls import ServerCertificateFiles, channel_credentials
from tests.support.certificates import TestAuthority
from tests.support.rpc import error_info

CREDENTIAL = "tls-listener-pool-credential"


class PoolEcho(worker_service_pb2_grpc.WorkerServiceServicer):
    """Answers a claim with nothing, once the caller is a pool (the stack checked it)."""

    async def ClaimJob(self, request: Any, context: Any) -> worker_service_pb2.ClaimJobResponse:
        assert current_principal().worker_pool == "gpu"
        return worker_service_pb2.ClaimJobResponse()


@pytest.fixture
def authorities(tmp_path: Path) -> tuple[TestAuthority, TestAuthority]:
    return TestAuthority(tmp_path, "first-ca"), TestAuthority(tmp_path, "second-ca")


@pytest.fixture
async def listener(
    tmp_path: Path, authorities: tuple[TestAuthority, TestAuthority]
) -> AsyncIterator[tuple[RunningService, ServerCertificateFiles]]:
    first, _ = authorities
    cert, key = first.issue(
        "listener", cert_path=tmp_path / "tls.crt", key_path=tmp_path / "tls.key"
    )
    files = ServerCertificateFiles(cert, key)
    app = ServiceApp(
        name="kit-tls",
        public=[],
        internal=[
            Binding(
                admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"],
                admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
                placeholder(admin_service_pb2_grpc.AdminServiceServicer),
            )
        ],
        serve_public=False,
        tls=TlsListener(
            kind="remote",
            port=0,
            certificate=files,
            bindings=[
                Binding(
                    worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"],
                    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server,
                    PoolEcho(),
                )
            ],
            authenticator=WorkerPoolAuthenticator({credential_hash(CREDENTIAL): "gpu"}),
        ),
    )
    running = RunningService(
        app, CommonSettings.read(EnvReader({"ATELIER_DRAIN_GRACE": "0"})), ListenSettings(0, 0, 0)
    )
    await running.start()
    yield running, files
    await running.stop()


def tls_channel(port: int, ca: Path) -> grpc.aio.Channel:
    # A subchannel pool of its own: a new connection (and handshake) for each channel.
    return grpc.aio.secure_channel(
        f"localhost:{port}",
        channel_credentials(ca),
        options=[("grpc.use_local_subchannel_pool", 1)],
    )


async def health_answer(port: int, ca: Path) -> grpc.StatusCode:
    async with tls_channel(port, ca) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def replace(target: Path, source: Path) -> None:
    """As a Kubernetes Secret volume does: the new file is renamed over the old."""
    os.replace(source, target)


async def test_the_listener_serves_its_bindings_and_health_over_tls_and_nothing_else(
    listener: tuple[RunningService, ServerCertificateFiles],
    authorities: tuple[TestAuthority, TestAuthority],
) -> None:
    running, _ = listener
    first, second = authorities
    assert running.tls_port and running.tls_port != running.internal_port
    assert await health_answer(running.tls_port, first.ca_path) == grpc.StatusCode.OK
    # Another authority's client does not trust it: the handshake fails.
    assert await health_answer(running.tls_port, second.ca_path) == grpc.StatusCode.UNAVAILABLE

    async with tls_channel(running.tls_port, first.ca_path) as channel:
        worker = worker_service_pb2_grpc.WorkerServiceStub(channel)
        claimed = await worker.ClaimJob(
            worker_service_pb2.ClaimJobRequest(),
            metadata=(("authorization", f"Bearer {CREDENTIAL}"),),
            timeout=5,
        )
        assert not claimed.HasField("job")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await worker.ClaimJob(worker_service_pb2.ClaimJobRequest(), timeout=5)
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(missing.value).reason == "SERVICE_CREDENTIAL_MISSING"

        # The internal listener's services and reflection are not there at all.
        admin = admin_service_pb2_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unserved:
            await admin.ListAttentionJobs(
                admin_service_pb2.ListAttentionJobsRequest(),
                metadata=(("authorization", f"Bearer {CREDENTIAL}"),),
                timeout=5,
            )
        assert unserved.value.code() == grpc.StatusCode.UNIMPLEMENTED
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as no_reflection:
            async for _ in reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            ):
                pass
        assert no_reflection.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_replaced_certificate_is_served_from_the_next_connection_without_a_restart(
    listener: tuple[RunningService, ServerCertificateFiles],
    authorities: tuple[TestAuthority, TestAuthority],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, files = listener
    first, second = authorities
    port = running.tls_port
    assert await health_answer(port, first.ca_path) == grpc.StatusCode.OK
    new_cert, new_key = second.issue("renewed", valid_days=90)

    # Half a rotation: the new certificate beside the old key does not load, so the
    # listener keeps serving the certificate it has.
    with caplog.at_level(logging.WARNING):
        replace(files.certificate, new_cert)
        assert await health_answer(port, first.ca_path) == grpc.StatusCode.OK
    assert "tls_certificate_reload_refused" in caplog.text
    assert await health_answer(port, second.ca_path) == grpc.StatusCode.UNAVAILABLE

    # The key follows: the next connection gets the new certificate.
    replace(files.key, new_key)
    assert await health_answer(port, second.ca_path) == grpc.StatusCode.OK
    assert await health_answer(port, first.ca_path) == grpc.StatusCode.UNAVAILABLE
    assert running.tls_certificate is not None
    assert running.tls_certificate.reloads == 1
    assert running.tls_certificate.current.subject == "CN=renewed"
    # The expiry the alert watches is the renewed certificate's (90 days, not 1).
    assert running.tls_certificate.current.not_after > datetime.now(UTC) + timedelta(days=80)
    expiry = REGISTRY.get_sample_value(
        "atelier_tls_certificate_expiry_timestamp_seconds", {"listener": "remote"}
    )
    assert expiry == running.tls_certificate.current.not_after.timestamp()
