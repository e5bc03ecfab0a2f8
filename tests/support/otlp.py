"""An OTLP/gRPC trace receiver for tests: what a collector would get from the services a
test runs as processes (``ATELIER_OTEL_EXPORTER=otlp``). It serves on its own threads, so
it answers while the test's event loop is busy or not running (a stack starting or
stopping)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id)


def _value(value: common_pb2.AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=span.name,
                            kind=KINDS.get(span.kind, "unspecified"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                        )
                    )
        self._receiver.add(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._changed = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None)

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self.spans.extend(spans)
            self._changed.notify_all()

    def where(self, test: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        with self._changed:
            return [s for s in self.spans if test(s)]

    async def wait_for(
        self, condition: Callable[[], bool], within: float = 20.0, what: str = "spans"
    ) -> None:
        """Returns once ``condition`` holds, checked each time spans arrive."""

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(condition, within)

        if not await asyncio.to_thread(wait):
            names = sorted({(s.service, s.name) for s in self.where(lambda s: True)})
            raise AssertionError(f"{what} not received within {within} s; got {names}")
