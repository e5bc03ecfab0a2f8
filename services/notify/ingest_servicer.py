"""NotifyIngestService: where creation's outbox relay delivers job states. Only on the
internal listener, behind the service credential (the server's auth interceptor refuses
anything else before this code runs).

Deliver applies a batch to the projection (version-gated: duplicates and reordering
change nothing) and, in the same transaction, records the pushes what moved implies;
then, once that has committed, hands what moved to the publisher. It
answers only after the commit, so a relay that got OK may mark its rows delivered.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from grpc import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from atelier.notify.v1 import notify_ingest_service_pb2_grpc
from services.kit.auth import principal_id_problem
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.logging import get_logger
from services.kit.outages import Throttle
from services.notify import projection
from services.notify.errors import Reason
from services.notify.fanout import Publisher
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
        applied = await projection.apply(
            self._engine,
            [m.state for m in request.messages],
            self._pushes.record if self._pushes else None,
        )
        try:
            await self._publisher.publish(applied)
        except Exception as error:
            # Committed already: a lost announcement costs latency (the backstop reads
            # the projection), so the relay must not deliver the batch again for it.
            if self._log.admit(type(error).__name__) is not None:
                log.warning("publish_failed", error=type(error).__name__, changes=len(applied))
        return pb.DeliverResponse(applied_count=len(applied))
