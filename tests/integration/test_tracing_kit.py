"""Traces through the kit on real grpc.aio servers and channels: the server stack makes a
SERVER span child of the caller's ``traceparent``, an internal client's call is a CLIENT
span whose context reaches the peer, and with tracing off nothing is made or sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from atelier.creation.v1 import (
    catalog_pb2,
    creation_service_pb2,
    creation_service_pb2_grpc,
    job_pb2,
)
from atelier.notify.v1 import (
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2,
    notify_service_pb2_grpc,
)
from services.kit.auth import issue_token
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.grpc_client import InternalClient
from services.kit.server import Binding, RunningService, ServiceApp
from services.kit.settings import (
    DEV_JWT_SECRET,
    DEV_SERVICE_TOKEN,
    CommonSettings,
    EnvReader,
    ListenSettings,
)
from tests.support.rpc import bearer
from tests.support.spans import Spans, parent_id, recorded_spans, span_id, trace_id

USER_TOKEN = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "tracer", 3600)
CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331
CALLER = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"
LIST = "atelier.creation.v1.CreationService/ListCatalog"
DELIVER = "atelier.notify.v1.NotifyIngestService/Deliver"
WATCH = "atelier.notify.v1.NotifyService/WatchJob"
SEEN: dict[str, Any] = {}


class Hop(creation_service_pb2_grpc.CreationServiceServicer):
    """ListCatalog calls the process's own internal listener, as creation calls media."""

    def __init__(self) -> None:
        self.peer: InternalClient | None = None

    async def ListCatalog(self, request: Any, context: Any) -> Any:
        assert self.peer is not None
        stub = notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(self.peer.channel)
        await stub.Deliver(notify_ingest_service_pb2.DeliverRequest(), **self.peer.call_options())
        return creation_service_pb2.ListCatalogResponse(models=[catalog_pb2.Model(model_id="m")])

    async def CancelJob(self, request: Any, context: Any) -> Any:
        raise invalid_argument("JOB_ID_INVALID", [FieldViolation("job_id", "must be a UUID")])

    async def GetJob(self, request: Any, context: Any) -> Any:
        raise RuntimeError("a bug")


class Ingest(notify_ingest_service_pb2_grpc.NotifyIngestServiceServicer):
    async def Deliver(self, request: Any, context: Any) -> Any:
        SEEN["traceparent"] = dict(context.invocation_metadata() or ()).get("traceparent")
        return notify_ingest_service_pb2.DeliverResponse()


class Watch(notify_service_pb2_grpc.NotifyServiceServicer):
    async def WatchJob(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for version in (1, 2):
            yield notify_service_pb2.WatchJobResponse(
                job=job_pb2.Job(job_id=request.job_id, version=version)
            )


async def start(hop: Hop) -> RunningService:
    app = ServiceApp(
        name="tracing-test",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                hop,
            )
        ],
        internal=[
            Binding(
                notify_ingest_service_pb2.DESCRIPTOR.services_by_name["NotifyIngestService"],
                notify_ingest_service_pb2_grpc.add_NotifyIngestServiceServicer_to_server,
                Ingest(),
            ),
            Binding(
                notify_service_pb2.DESCRIPTOR.services_by_name["NotifyService"],
                notify_service_pb2_grpc.add_NotifyServiceServicer_to_server,
                Watch(),
            ),
        ],
    )
    common = CommonSettings.read(EnvReader({"ATELIER_DRAIN_GRACE": "0"}))
    running = RunningService(app, common, ListenSettings(0, 0, 0))
    await running.start()
    hop.peer = InternalClient(
        f"127.0.0.1:{running.internal_port}", DEV_SERVICE_TOKEN, service="any"
    )
    return running


@pytest.fixture
async def traced() -> AsyncIterator[tuple[RunningService, Spans]]:
    with recorded_spans() as spans:
        hop = Hop()
        running = await start(hop)
        yield running, spans
        assert hop.peer is not None
        await hop.peer.close()
        await running.stop()


def by_kind(found: list[ReadableSpan]) -> tuple[ReadableSpan, ReadableSpan]:
    """The CLIENT and the SERVER span of one call."""
    kinds = {s.kind: s for s in found}
    assert len(found) == 2 and set(kinds) == {SpanKind.CLIENT, SpanKind.SERVER}
    return kinds[SpanKind.CLIENT], kinds[SpanKind.SERVER]


async def list_catalog(port: int, *extra: tuple[str, str]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        await stub.ListCatalog(
            creation_service_pb2.ListCatalogRequest(), metadata=(*bearer(USER_TOKEN), *extra)
        )


async def test_the_callers_traceparent_is_the_parent_and_the_hop_carries_the_trace(
    traced: tuple[RunningService, Spans],
) -> None:
    running, spans = traced
    await list_catalog(running.public_port, ("traceparent", CALLER))
    await spans.wait_for(lambda: len(spans.named(LIST)) == 1)

    server = spans.one(LIST)
    assert server.kind is SpanKind.SERVER
    assert trace_id(server) == CALLER_TRACE
    assert parent_id(server) == CALLER_SPAN
    assert server.parent is not None and server.parent.is_remote
    assert dict(server.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "atelier.creation.v1.CreationService",
        "rpc.method": "ListCatalog",
        "rpc.grpc.status_code": 0,
    }
    # The internal call: a CLIENT span under the handler's, the peer's SERVER span under it.
    hop_client, hop_server = by_kind(spans.named(DELIVER))
    assert parent_id(hop_client) == span_id(server)
    assert parent_id(hop_server) == span_id(hop_client)
    assert {trace_id(hop_client), trace_id(hop_server)} == {CALLER_TRACE}
    assert SEEN["traceparent"] == f"00-{CALLER_TRACE:032x}-{span_id(hop_client):016x}-01"


async def test_without_a_traceparent_the_rpc_starts_a_trace(
    traced: tuple[RunningService, Spans],
) -> None:
    running, spans = traced
    await list_catalog(running.public_port)
    await spans.wait_for(lambda: len(spans.named(LIST)) == 1)
    assert spans.one(LIST).parent is None


async def test_a_malformed_traceparent_is_ignored(traced: tuple[RunningService, Spans]) -> None:
    running, spans = traced
    await list_catalog(running.public_port, ("traceparent", "00-not-a-trace-01"))
    await spans.wait_for(lambda: len(spans.named(LIST)) == 1)
    assert spans.one(LIST).parent is None


async def test_the_span_says_how_the_rpc_ended(traced: tuple[RunningService, Spans]) -> None:
    running, spans = traced
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        user = bearer(USER_TOKEN)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.CancelJob(creation_service_pb2.CancelJobRequest(), metadata=user)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetJob(creation_service_pb2.GetJobRequest(), metadata=user)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.ListJobs(creation_service_pb2.ListJobsRequest())  # no credential
        # Probes make no spans.
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    names = ("CancelJob", "GetJob", "ListJobs")
    await spans.wait_for(
        lambda: all(spans.named(f"atelier.creation.v1.CreationService/{n}") for n in names)
    )
    ended = {s.name.rpartition("/")[2]: s for s in spans.finished}
    # The caller's mistakes leave the status unset; the server's failure is an error.
    assert ended["CancelJob"].attributes["rpc.grpc.status_code"] == 3  # type: ignore[index]
    assert ended["CancelJob"].status.status_code is StatusCode.UNSET
    assert ended["ListJobs"].attributes["rpc.grpc.status_code"] == 16  # type: ignore[index]
    assert ended["ListJobs"].status.status_code is StatusCode.UNSET
    assert ended["GetJob"].attributes["rpc.grpc.status_code"] == 13  # type: ignore[index]
    assert ended["GetJob"].status.status_code is StatusCode.ERROR
    assert not [s for s in spans.finished if "Health" in s.name]


async def test_a_response_streams_span_ends_when_the_stream_does(
    traced: tuple[RunningService, Spans],
) -> None:
    running, spans = traced
    client = InternalClient(f"127.0.0.1:{running.internal_port}", DEV_SERVICE_TOKEN, service="x")
    try:
        stub = notify_service_pb2_grpc.NotifyServiceStub(client.channel)
        call = stub.WatchJob(
            notify_service_pb2.WatchJobRequest(job_id="j"), **client.call_options()
        )
        versions = [m.job.version async for m in call]
    finally:
        await client.close()
    assert versions == [1, 2]
    await spans.wait_for(lambda: len(spans.named(WATCH)) == 2)
    client_span, server_span = by_kind(spans.named(WATCH))
    assert parent_id(server_span) == span_id(client_span)
    assert client_span.attributes["rpc.grpc.status_code"] == 0  # type: ignore[index]
    assert client_span.end_time is not None and server_span.end_time is not None


async def test_with_tracing_off_nothing_is_traced_or_sent() -> None:
    hop = Hop()
    SEEN.clear()
    running = await start(hop)
    try:
        await list_catalog(running.public_port, ("traceparent", CALLER))
        # The caller's header is not forwarded by an untraced hop either: the internal
        # channel has no interceptor.
        assert "traceparent" in SEEN and SEEN["traceparent"] is None
        assert hop.peer is not None
        channel: Any = hop.peer.channel
        assert channel._unary_unary_interceptors == channel._unary_stream_interceptors == []
    finally:
        assert hop.peer is not None
        await hop.peer.close()
        await running.stop()
