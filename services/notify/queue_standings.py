"""creation's QueueStandingService as the streams' standings component asks it
(streams/standings.py): the service credential, a deadline, and no answer (logged,
throttled) when creation cannot say, so the streams keep what they hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from atelier.creation.v1 import queue_standing_service_pb2, queue_standing_service_pb2_grpc
from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.grpc_client import InternalClient, RemoteFailure
from services.kit.logging import get_logger
from services.kit.outages import Throttle

log = get_logger(__name__)

_SERVICE = "atelier.creation.v1.QueueStandingService"


class CreationStandings:
    """GetQueueStandings on creation's internal listener."""

    def __init__(
        self, address: str, service_token: str, tls: grpc.ChannelCredentials | None = None
    ) -> None:
        self._client = InternalClient(
            address,
            service_token,
            service=_SERVICE,
            idempotent_methods=("GetQueueStandings",),
            tls=tls,
        )
        self._stub: Any = None
        self._throttle = Throttle()

    async def __call__(self, job_ids: Sequence[str]) -> Mapping[str, pb.JobStanding] | None:
        if self._stub is None:
            self._stub = queue_standing_service_pb2_grpc.QueueStandingServiceStub(
                self._client.channel
            )
        try:
            reply = await self._stub.GetQueueStandings(
                queue_standing_service_pb2.GetQueueStandingsRequest(job_ids=list(job_ids)),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            failure = RemoteFailure.of(error)
            if self._throttle.admit(f"GetQueueStandings:{failure.reason}") is not None:
                log.warning("creation_call_failed", call="GetQueueStandings", reason=failure.reason)
            return None
        standings = {}
        for placed in reply.standings:
            standing = pb.JobStanding(
                job_id=placed.job_id, version=placed.version, queue_position=placed.queue_position
            )
            if placed.HasField("estimated_start_time"):
                standing.estimated_start_time.CopyFrom(placed.estimated_start_time)
            standings[placed.job_id] = standing
        return standings

    async def close(self) -> None:
        await self._client.close()
