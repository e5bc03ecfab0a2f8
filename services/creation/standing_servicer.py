"""QueueStandingService (internal listener only): where queued jobs stand, for notify's
streams, which ask for the queued jobs they watch every few seconds (one call per notify
replica, whatever the number of streams)."""

from __future__ import annotations

from typing import Any

from grpc import aio

from atelier.creation.v1 import queue_standing_service_pb2 as pb
from atelier.creation.v1 import queue_standing_service_pb2_grpc
from services.creation.errors import Reason
from services.creation.queue_standing import IDS_LIMIT, QueueStanding
from services.kit.clock import Clock
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.ids import canonical_uuid
from services.kit.timestamps import set_timestamp

Context = aio.ServicerContext[Any, Any]


class QueueStandingServicer(queue_standing_service_pb2_grpc.QueueStandingServiceServicer):
    def __init__(self, standing: QueueStanding, clock: Clock) -> None:
        self._standing = standing
        self._clock = clock

    async def GetQueueStandings(
        self, request: pb.GetQueueStandingsRequest, context: Context
    ) -> pb.GetQueueStandingsResponse:
        ids = list(request.job_ids)
        if not 0 < len(ids) <= IDS_LIMIT:
            raise invalid_argument(
                Reason.INVALID_JOB_ID,
                [FieldViolation("job_ids", f"must hold 1 to {IDS_LIMIT} job ids")],
            )
        canonical = [canonical_uuid(i) for i in ids]
        problems = [
            FieldViolation(f"job_ids[{n}]", "must be a UUID")
            for n, job_id in enumerate(canonical)
            if job_id is None
        ]
        if problems:
            raise invalid_argument(Reason.INVALID_JOB_ID, problems)
        placed = await self._standing.of_ids(
            sorted({i for i in canonical if i is not None}), self._clock()
        )
        reply = pb.GetQueueStandingsResponse()
        for job in placed:
            standing = reply.standings.add(
                job_id=job.job_id, version=job.version, queue_position=job.standing.position
            )
            if job.standing.estimated_start is not None:
                set_timestamp(standing.estimated_start_time, job.standing.estimated_start)
        return reply
