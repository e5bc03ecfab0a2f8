"""NotifyIngestService: where creation's outbox relay delivers job states. Only on the
internal listener, behind the service credential (the server's auth interceptor refuses
anything else before this code runs).

Deliver applies a batch to the projection (version-gated: duplicates and reordering
change nothing) and, in the same transaction, records the pushes what moved implies;
then, once that has committed, hands what moved to the publisher. It
answers only after the commit, so a relay that got OK may mark its rows delivered.

While tracing is on, each message that carries its job's trace context gets a span in
that trace (a child of the job's submit), linked to this Deliver's own span: the job's
trace shows each of its states reaching notify, and the batch shows which jobs it held.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from grpc import aio
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, get_current_span
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from atelier.notify.v1 import notify_ingest_service_pb2_grpc
from services.kit import tracing
from services.kit.auth import principal_id_problem
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.logging import get_logger
from services.kit.outages import Throttle
from services.notify import projection
from services.notify.errors import Reason
from services.notify.fanout import Publisher
from services.notify.projection import AppliedState
from services.notify.pushes.queue import PushQueue

log = get_logger(__name__)

# Far above the relay's largest batch; a request past it is a bug, not load.
MAX_MESSAGES = 1000
_KNOWN_STATUSES = frozenset(job_pb2.JobStatus.values()) - {job_pb2.JOB_STATUS_UNSPECIFIED}


def _problems(messages: Sequence[pb.OutboxMessage]) -> list[FieldViolation]:
    if not messages:
        return [FieldViolation("messages", "must hold at least one message")]
    if len(messages) > MAX_MESSAGES:
        return [FieldViolation("messages", f"must hold at most {MAX_MESSAGES} messages")]
    problems: list[FieldViolation] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}].state"
        if not message.HasField("state"):
            problems.append(FieldViolation(where, "is required"))
            continue
        state = message.state
        try:
            uuid.UUID(state.job_id)
        except ValueError:
            problems.append(FieldViolation(f"{where}.job_id", "must be a job id (a UUID)"))
        user_problem = principal_id_problem(state.user_id)
        if user_problem is not None:
            problems.append(FieldViolation(f"{where}.user_id", user_problem))
        if state.version < 1:
            problems.append(FieldViolation(f"{where}.version", "must be at least 1"))
        if state.status not in _KNOWN_STATUSES:
            problems.append(FieldViolation(f"{where}.status", "must be a known job status"))
    return problems


class NotifyIngestServicer(notify_ingest_service_pb2_grpc.NotifyIngestServiceServicer):
    def __init__(
        self, engine: AsyncEngine, publisher: Publisher, pushes: PushQueue | None = None
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self._pushes = pushes
        self._log = Throttle()

    async def Deliver(
        self, request: pb.DeliverRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.DeliverResponse:
        problems = _problems(request.messages)
        if problems:
            raise invalid_argument(Reason.INVALID_DELIVERY, problems)
        tracer = tracing.tracer()
        if tracer is None:
            applied = await self._apply(request.messages)
        else:
            spans = _message_spans(tracer, request.messages)
            try:
                applied = await self._apply(request.messages)
            except BaseException:
                _end_message_spans(spans, None)
                raise
            _end_message_spans(spans, {(a.job_id, a.version) for a in applied})
        return pb.DeliverResponse(applied_count=len(applied))

    async def _apply(self, messages: Sequence[pb.OutboxMessage]) -> list[AppliedState]:
        applied = await projection.apply(
            self._engine,
            [m.state for m in messages],
            self._pushes.record if self._pushes else None,
        )
        try:
            await self._publisher.publish(applied)
        except Exception as error:
            # Committed already: a lost announcement costs latency (the backstop reads
            # the projection), so the relay must not deliver the batch again for it.
            if self._log.admit(type(error).__name__) is not None:
                log.warning("publish_failed", error=type(error).__name__, changes=len(applied))
        return applied


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
        state = message.state
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
            key = (message.state.job_id, message.state.version)
            span.set_attribute("atelier.applied", key in moved)
        span.end()
