"""The shared server bootstrap on a real grpc.aio server and a real channel: auth on both
listeners, the error table, health that follows readiness, streams, metrics, reflection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY
from sqlalchemy import text

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    catalog_pb2,
    creation_service_pb2,
    creation_service_pb2_grpc,
    job_pb2,
)
from atelier.notify.v1 import notify_service_pb2, notify_service_pb2_grpc
from services.dev.processes import free_port
from services.kit.auth import current_principal, issue_token
from services.kit.components import ComponentFailed, Supervisor, TaskComponent
from services.kit.db import create_engine
from services.kit.errors import ApiError, DomainError, FieldViolation, invalid_argument
from services.kit.server import (
    LIVENESS_SERVICE,
    Binding,
    RunningService,
    ServiceApp,
    placeholder,
)
from services.kit.settings import (
    DEV_JWT_SECRET,
    DEV_SERVICE_TOKEN,
    CommonSettings,
    EnvReader,
    ListenSettings,
)
from tests.support.rpc import bad_request, bearer, error_info, retry_delay

USER_TOKEN = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "alice", 3600)


class FakeCreation(creation_service_pb2_grpc.CreationServiceServicer):
    async def ListCatalog(
        self, request: Any, context: Any
    ) -> creation_service_pb2.ListCatalogResponse:
        # Echo the caller so the test can see the principal reached the handler.
        return creation_service_pb2.ListCatalogResponse(
            models=[catalog_pb2.Model(model_id="m", display_name=current_principal().user_id)]
        )

    async def GetJob(self, request: Any, context: Any) -> Any:
        raise RuntimeError("connection to postgres://admin:hunter2@db failed")

    async def GetBalance(self, request: Any, context: Any) -> Any:
        raise QuotaGone()

    async def ListJobs(self, request: Any, context: Any) -> Any:
        raise Unmapped("secret detail")

    async def CancelJob(self, request: Any, context: Any) -> Any:
        raise invalid_argument("JOB_ID_INVALID", [FieldViolation("job_id", "must be a UUID")])


class QuotaGone(DomainError):
    def to_api_error(self) -> ApiError:
        return ApiError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "TEST_QUOTA", "no more", retry_after_seconds=7
        )


class Unmapped(DomainError):
    """A domain failure whose author forgot to say how clients see it."""


class FakeNotify(notify_service_pb2_grpc.NotifyServiceServicer):
    async def WatchJob(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for version in (1, 2):
            yield notify_service_pb2.WatchJobResponse(
                job=job_pb2.Job(job_id=request.job_id, version=version)
            )
        raise ApiError(grpc.StatusCode.ABORTED, "STREAM_TEST_FAILURE", "failed after two")


class Readiness:
    def __init__(self) -> None:
        self.ready = True

    async def __call__(self) -> bool:
        return self.ready


@pytest.fixture
async def service() -> AsyncIterator[tuple[RunningService, Readiness]]:
    running, readiness = await start_service({"ATELIER_DRAIN_GRACE": "0"})
    yield running, readiness
    await running.stop()


async def start_service(env: dict[str, str]) -> tuple[RunningService, Readiness]:
    readiness = Readiness()
    app = ServiceApp(
        name="kit-test",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                FakeCreation(),
            ),
            Binding(
                notify_service_pb2.DESCRIPTOR.services_by_name["NotifyService"],
                notify_service_pb2_grpc.add_NotifyServiceServicer_to_server,
                FakeNotify(),
            ),
        ],
        internal=[
            Binding(
                admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"],
                admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
                placeholder(admin_service_pb2_grpc.AdminServiceServicer),
            )
        ],
        readiness=readiness,
    )
    running = RunningService(app, CommonSettings.read(EnvReader(env)), ListenSettings(0, 0, 0))
    await running.start()
    return running, readiness


def channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}")


async def test_public_rpc_needs_a_token(service: tuple[RunningService, Readiness]) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListCatalog(creation_service_pb2.ListCatalogRequest())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(caught.value).reason == "TOKEN_MISSING"
        assert error_info(caught.value).domain == "atelier.dev"

        reply = await stub.ListCatalog(
            creation_service_pb2.ListCatalogRequest(), metadata=bearer(USER_TOKEN)
        )
        assert reply.models[0].display_name == "alice"


async def test_unexpected_exception_is_internal_without_details(
    service: tuple[RunningService, Readiness], caplog: pytest.LogCaptureFixture
) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetJob(
                creation_service_pb2.GetJobRequest(job_id="x"), metadata=bearer(USER_TOKEN)
            )
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "internal error"
    assert "hunter2" not in str(caught.value.trailing_metadata())
    assert error_info(caught.value).reason == "INTERNAL"
    # The stack goes to the log instead.
    assert any(r.getMessage() == "rpc_failed" and r.exc_info for r in caplog.records)


async def test_api_error_keeps_code_reason_and_field_violations(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CancelJob(
                creation_service_pb2.CancelJobRequest(job_id="x"), metadata=bearer(USER_TOKEN)
            )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "JOB_ID_INVALID"
    violations = bad_request(caught.value)
    assert violations is not None
    assert violations.field_violations[0].field == "job_id"


async def test_domain_error_maps_through_its_own_table(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        call = stub.GetBalance(
            creation_service_pb2.GetBalanceRequest(), metadata=bearer(USER_TOKEN)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(caught.value).reason == "TEST_QUOTA"
    # The retry hint also travels as a response header for HTTP clients.
    assert ("retry-after", "7") in tuple(caught.value.initial_metadata() or ())


async def test_an_unmapped_domain_error_is_internal_without_its_text(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListJobs(creation_service_pb2.ListJobsRequest(), metadata=bearer(USER_TOKEN))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "internal error"
    assert "secret" not in str(caught.value.trailing_metadata())


async def test_unimplemented_rpc(service: tuple[RunningService, Readiness]) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = creation_service_pb2_grpc.CreationServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(
                creation_service_pb2.SubmitJobRequest(), metadata=bearer(USER_TOKEN)
            )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error_info(caught.value).reason == "NOT_IMPLEMENTED"


async def test_stream_is_authenticated_and_fails_after_messages(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    async with channel(running.public_port) as ch:
        stub = notify_service_pb2_grpc.NotifyServiceStub(ch)
        denied = stub.WatchJob(notify_service_pb2.WatchJobRequest(job_id="j"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in denied:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

        call = stub.WatchJob(
            notify_service_pb2.WatchJobRequest(job_id="j"), metadata=bearer(USER_TOKEN)
        )
        versions = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for message in call:
                versions.append(message.job.version)
        assert versions == [1, 2]
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert error_info(caught.value).reason == "STREAM_TEST_FAILURE"


async def test_internal_listener_wants_the_service_credential(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    async with channel(running.internal_port) as ch:
        stub = admin_service_pb2_grpc.AdminServiceStub(ch)
        request = admin_service_pb2.ListAttentionJobsRequest()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListAttentionJobs(request, metadata=bearer(USER_TOKEN))
        assert error_info(caught.value).reason == "SERVICE_CREDENTIAL_INVALID"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListAttentionJobs(request, metadata=bearer(DEV_SERVICE_TOKEN))
        # Authenticated: it reaches the (not yet implemented) handler.
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    async with channel(running.public_port) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await admin_service_pb2_grpc.AdminServiceStub(ch).ListAttentionJobs(
                request, metadata=bearer(DEV_SERVICE_TOKEN)
            )
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert caught.value.details() == "Method not found!"


async def test_health_follows_readiness_and_drain() -> None:
    # A drain window (production has 5 s): the window is what lets a watcher be told
    # NOT_SERVING before the server stops; with none (the dev default) the stop may cancel
    # the Watch before its last message is out, as a loaded run showed.
    running, readiness = await start_service(
        {"ATELIER_DRAIN_WINDOW": "1", "ATELIER_DRAIN_GRACE": "0"}
    )
    stopping: asyncio.Task[None] | None = None
    try:
        async with channel(running.public_port) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            name = "atelier.creation.v1.CreationService"
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

            readiness.ready = False
            await running._refresh_health()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

            readiness.ready = True
            await running._refresh_health()
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            stopping = asyncio.create_task(running.stop())
            # The drain announces NOT_SERVING before the server goes away.
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            await stopping
    finally:
        if stopping is None:  # failed before the drain began
            await running.stop()


async def test_liveness_stays_serving_while_readiness_fails(
    service: tuple[RunningService, Readiness],
) -> None:
    """The Kubernetes liveness probe (deploy/k8s) asks for LIVENESS_SERVICE: a database
    outage makes the replica unready, never a restart candidate."""
    running, readiness = service
    readiness.ready = False
    await running._refresh_health()
    for port in (running.public_port, running.internal_port):
        async with channel(port) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            ready = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert ready.status == health_pb2.HealthCheckResponse.NOT_SERVING
            alive = await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE))
            assert alive.status == health_pb2.HealthCheckResponse.SERVING


async def test_rpcs_are_counted_by_method_and_code(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service
    labels = {
        "service": "kit-test",
        "method": "/atelier.creation.v1.CreationService/ListCatalog",
        "code": "UNAUTHENTICATED",
    }
    before = REGISTRY.get_sample_value("atelier_rpc_total", labels) or 0.0
    async with channel(running.public_port) as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await creation_service_pb2_grpc.CreationServiceStub(ch).ListCatalog(
                creation_service_pb2.ListCatalogRequest()
            )
    assert REGISTRY.get_sample_value("atelier_rpc_total", labels) == before + 1
    assert (REGISTRY.get_sample_value("atelier_rpc_duration_seconds_count", labels) or 0) >= 1


async def test_reflection_lists_each_listeners_services(
    service: tuple[RunningService, Readiness],
) -> None:
    running, _ = service

    async def listed(port: int) -> set[str]:
        async with channel(port) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = stub.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            reply = await call.read()
            await call.done_writing()
            return {s.name for s in reply.list_services_response.service}

    public = await listed(running.public_port)
    internal = await listed(running.internal_port)
    assert "atelier.creation.v1.CreationService" in public
    assert "atelier.creation.v1.AdminService" not in public
    assert "atelier.creation.v1.AdminService" in internal
    assert "atelier.creation.v1.CreationService" not in internal


async def test_a_dying_background_task_fails_the_service() -> None:
    async def crashes() -> None:
        raise RuntimeError("relay lost its mind")

    app = ServiceApp(
        name="kit-crash", public=[], internal=[], components=[TaskComponent("relay", crashes)]
    )
    common = CommonSettings.read(EnvReader({"ATELIER_DRAIN_GRACE": "0"}))
    running = RunningService(app, common, ListenSettings(0, 0, 0))
    await running.start()
    await asyncio.wait_for(running.failed.wait(), timeout=5)
    assert isinstance(running.failure, RuntimeError)
    await running.stop()


class DatabaseDown(creation_service_pb2_grpc.CreationServiceServicer):
    """Every call reaches for a database that is not there, through the real driver."""

    def __init__(self) -> None:
        self.engine = create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/none")

    async def GetBalance(self, request: Any, context: Any) -> Any:
        async with self.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))


async def test_a_database_outage_is_unavailable_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = DatabaseDown()
    app = ServiceApp(
        name="kit-outage",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                servicer,
            )
        ],
        internal=[],
    )
    running = RunningService(app, CommonSettings.read(EnvReader({})), ListenSettings(0, 0, 0))
    await running.start()
    try:
        async with channel(running.public_port) as ch:
            stub = creation_service_pb2_grpc.CreationServiceStub(ch)
            for _ in range(5):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.GetBalance(
                        creation_service_pb2.GetBalanceRequest(), metadata=bearer(USER_TOKEN)
                    )
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert error_info(caught.value).reason == "DATABASE_UNAVAILABLE"
                assert retry_delay(caught.value) is not None
    finally:
        await running.stop()
        await servicer.engine.dispose()
    outage_lines = [r for r in caplog.records if r.getMessage() == "dependency_unavailable"]
    assert len(outage_lines) == 1
    assert not any(r.exc_info for r in caplog.records)


class Recorder:
    """A component that notes what it saw; its stop checks the server still answers."""

    def __init__(self, name: str, events: list[str], probe: Any = None) -> None:
        self.name = name
        self.events = events
        self.probe = probe
        self._stop = asyncio.Event()

    async def run(self) -> None:
        self.events.append(f"{self.name} running")
        await self._stop.wait()
        self.events.append(f"{self.name} ended")

    async def stop(self, deadline: float) -> None:
        if self.probe is not None:
            self.events.append(f"{self.name} stop; server answers: {await self.probe()}")
        self._stop.set()


async def test_sigterm_drain_keeps_serving_then_stops_components_before_the_server() -> None:
    events: list[str] = []
    holder: dict[str, RunningService] = {}

    async def server_answers() -> bool:
        async with channel(holder["running"].public_port) as ch:
            stub = creation_service_pb2_grpc.CreationServiceStub(ch)
            await stub.ListCatalog(
                creation_service_pb2.ListCatalogRequest(), metadata=bearer(USER_TOKEN), timeout=2
            )
        return True

    app = ServiceApp(
        name="kit-drain",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                FakeCreation(),
            )
        ],
        internal=[],
        components=[Recorder("worker", events, server_answers)],
        cleanup=[lambda: _note(events, "cleanup")],
    )
    common = CommonSettings.read(
        EnvReader({"ATELIER_DRAIN_WINDOW": "1", "ATELIER_DRAIN_GRACE": "2"})
    )
    running = RunningService(app, common, ListenSettings(0, 0, 0))
    holder["running"] = running
    await running.start()
    async with channel(running.public_port) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(running.stop())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        # Inside the window: health says NOT_SERVING, yet new calls are still served and
        # the components still run.
        assert await server_answers()
        assert events == ["worker running"]
        await stopping
    assert events == [
        "worker running",
        "worker stop; server answers: True",
        "worker ended",
        "cleanup",
    ]


async def _note(events: list[str], event: str) -> None:
    events.append(event)


class Overrunning:
    name = "stubborn"

    def __init__(self) -> None:
        self.cancelled = False

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def stop(self, deadline: float) -> None:
        pass  # ignores the request


async def test_a_component_that_overruns_its_deadline_is_cancelled() -> None:
    stubborn = Overrunning()
    supervisor = Supervisor([stubborn])
    supervisor.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(supervisor.stop(0.2), timeout=5)
    assert stubborn.cancelled
    assert supervisor.failure is None


async def test_a_component_that_ends_on_its_own_fails_the_service() -> None:
    async def returns() -> None:
        return None

    supervisor = Supervisor([TaskComponent("quitter", returns)])
    supervisor.start()
    await asyncio.wait_for(supervisor.failed.wait(), timeout=5)
    assert isinstance(supervisor.failure, ComponentFailed)
    await supervisor.stop(1)


async def test_a_worker_only_process_has_no_public_listener() -> None:
    app = ServiceApp(name="kit-worker", public=[], internal=[], serve_public=False)
    running = RunningService(app, CommonSettings.read(EnvReader({})), ListenSettings(0, 0, 0))
    await running.start()
    try:
        assert running.public_port == 0
        async with channel(running.internal_port) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.stop()
