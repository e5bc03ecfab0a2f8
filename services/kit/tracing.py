"""Traces (OpenTelemetry): one tracer per process, off unless a setting turns it on.

Off (``ATELIER_OTEL_EXPORTER=none``, the default) :func:`tracer` is None and every place
that traces checks that once, when it is built (the server stack per method, an internal
client per channel), so an untraced RPC runs no tracing code at all. On (``otlp``) spans
go in batches to an OTLP/gRPC collector at ``ATELIER_OTEL_ENDPOINT``.

Context travels as the W3C ``traceparent`` header: in gRPC metadata between processes
(the edge passes the client's on), and as a stored string where work outlives the call
that began it (a job keeps its submit's, see ``creation.jobs.trace_parent``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    Span,
    SpanKind,
    Tracer,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.kit.settings import TracingSettings

TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()
_INSTRUMENTATION = "atelier"

# "No parent" in a context: a span started under it begins a trace of its own.
_NO_SPAN = NonRecordingSpan(INVALID_SPAN_CONTEXT)

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


def tracer() -> Tracer | None:
    """The process's tracer; None while tracing is off."""
    return _tracer


def install(provider: TracerProvider | None) -> None:
    """Makes ``provider`` the process's (None: tracing off). Parts built afterwards (server
    stacks, internal channels) trace with it; tests install one with an in-memory
    exporter."""
    global _provider, _tracer
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer(_INSTRUMENTATION)


def configure(settings: TracingSettings, service: str) -> None:
    """Sets the process up as ``settings`` say (at start, before any server is built)."""
    if settings.exporter == "none":
        install(None)
        return
    # Imported only when used: the exporter pulls in the OTLP protobuf modules.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "service.namespace": "atelier"}),
        # A caller's sampling decision stands; a trace that starts here is sampled at the
        # ratio.
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    exporter = OTLPSpanExporter(
        endpoint=settings.endpoint,
        insecure=settings.endpoint.startswith("http://"),
        timeout=settings.export_timeout_seconds,
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, schedule_delay_millis=int(settings.export_delay_seconds * 1000)
        )
    )
    install(provider)


def shutdown() -> None:
    """Sends what is still buffered and stops (at the end of the process)."""
    if _provider is not None:
        _provider.shutdown()
    install(None)


class _MetadataGetter(Getter[Sequence[tuple[str, Any]]]):
    """Reads headers from gRPC metadata (pairs, keys lowercase)."""

    def get(self, carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [v for k, v in carrier if k == key and isinstance(v, str)]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _MetadataGetter()


def context_from_metadata(metadata: Sequence[tuple[str, Any]]) -> Context:
    """The caller's trace context from an RPC's metadata (empty when it sent none or a
    malformed one: the span then starts a trace)."""
    return _PROPAGATOR.extract(metadata, getter=_GETTER)


def context_from_traceparent(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` names; None for none or a malformed one."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    if not get_current_span(context).get_span_context().is_valid:
        return None
    return context


def traceparent_of(span: Span) -> str | None:
    """``span``'s context as a ``traceparent`` header value; None for an invalid one."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The current span's context as a ``traceparent`` (to store with work that outlives
    this call); None while tracing is off or outside any span."""
    if _tracer is None:
        return None
    return traceparent_of(get_current_span())


def with_traceparent(metadata: Iterable[tuple[str, Any]], span: Span) -> list[tuple[str, Any]]:
    """``metadata`` carrying ``span`` as the callee's parent (any traceparent it had is
    replaced)."""
    pairs = [(k, v) for k, v in metadata if k != TRACEPARENT]
    header = traceparent_of(span)
    if header is not None:
        pairs.append((TRACEPARENT, header))
    return pairs


def link_to(traceparent: str | None) -> Link | None:
    """A link to the span a stored ``traceparent`` names."""
    context = context_from_traceparent(traceparent)
    if context is None:
        return None
    return Link(get_current_span(context).get_span_context())


@contextmanager
def span_in_trace(
    name: str,
    traceparent: str | None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
    links: Sequence[Link] = (),
) -> Iterator[Span | None]:
    """A current span, child of the span ``traceparent`` names (a new trace when it names
    none); yields None and does nothing while tracing is off."""
    if _tracer is None:
        yield None
        return
    parent = context_from_traceparent(traceparent)
    if parent is None:
        # Not the ambient span: stored work starts its own trace rather than joining
        # whatever this task happened to run under.
        parent = set_span_in_context(_NO_SPAN)
    with _tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes, links=links
    ) as span:
        yield span
