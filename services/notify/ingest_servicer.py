"""NotifyIngestService: where creation's outbox relay delivers job states. Only on the
internal listener, behind the service credential (the server's auth interceptor refuses
anything else before this code runs). Thin: check the batch, hand it to
:class:`services.notify.delivery.Delivery`, answer how many states moved. The answer goes
out only after the commit, so a relay that got OK may mark its rows delivered.

While tracing is on, each message that carries its job's trace context gets a span in
that trace (a child of the job's submit), linked to this Deliver's own span: the job's
trace shows each of its states reaching notify, and the batch shows which jobs it held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpc import aio
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, get_current_span

from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from atelier.notify.v1 import notify_ingest_service_pb2_grpc
from services.kit import tracing
from services.notify import fields
from services.notify.delivery import Delivery


class NotifyIngestServicer(notify_ingest_service_pb2_grpc.NotifyIngestServiceServicer):
    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery

    async def Deliver(
        self, request: pb.DeliverRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.DeliverResponse:
        states = fields.delivered_states(request.messages)
        tracer = tracing.tracer()
        if tracer is None:
            applied = await self._delivery.deliver(states)
        else:
            spans = _message_spans(tracer, request.messages)
            try:
                applied = await self._delivery.deliver(states)
            except BaseException:
                _end_message_spans(spans, None)
                raise
            _end_message_spans(spans, {(a.job_id, a.version) for a in applied})
        return pb.DeliverResponse(applied_count=len(applied))


def _message_spans(
    tracer: Tracer, messages: Sequence[pb.OutboxMessage]
) -> list[tuple[Span, pb.OutboxMessage]]:
    """A span for each message in its job's trace, linked to this Deliver's span."""
    batch = Link(get_current_span().get_span_context())
    spans = []
    for message in messages:
        parent = tracing.context_from_traceparent(message.traceparent)
        if parent is None:
            continue
        state = message.job
        span = tracer.start_span(
            "job state ingest",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=[batch],
            attributes={
                "atelier.job_id": state.job_id,
                "atelier.job_version": state.version,
                "atelier.outbox_id": message.outbox_id,
            },
        )
        spans.append((span, message))
    return spans


def _end_message_spans(
    spans: list[tuple[Span, pb.OutboxMessage]], moved: set[tuple[str, int]] | None
) -> None:
    """``moved``: the (job, version) pairs the projection took; None: the batch failed."""
    for span, message in spans:
        if moved is None:
            span.set_status(Status(StatusCode.ERROR, "the batch was not applied"))
        else:
            # False for a duplicate or a stale version: nothing moved, as designed.
            key = (message.job.job_id, message.job.version)
            span.set_attribute("atelier.applied", key in moved)
        span.end()
