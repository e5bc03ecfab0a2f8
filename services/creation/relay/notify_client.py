"""creation's view of notify's ingest, over notify's internal gRPC listener."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from atelier.notify.v1 import notify_ingest_service_pb2_grpc
from services.kit.grpc_client import InternalClient, RemoteFailure

_SERVICE = "atelier.notify.v1.NotifyIngestService"
# Deliver is version-gated on notify's side: sending a batch again changes nothing.
_IDEMPOTENT = ("Deliver",)


class DeliveryFailed(Exception):
    """notify did not take the batch (down, frozen, or refusing it)."""

    def __init__(self, failure: RemoteFailure) -> None:
        super().__init__(f"{failure.code.name} {failure.reason}")
        self.failure = failure


class NotifyClient:
    def __init__(
        self,
        address: str,
        service_token: str,
        timeout_seconds: float,
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._client = InternalClient(
            address,
            service_token,
            service=_SERVICE,
            idempotent_methods=_IDEMPOTENT,
            timeout_seconds=timeout_seconds,
            tls=tls,
        )
        self._stub_instance: notify_ingest_service_pb2_grpc.NotifyIngestServiceAsyncStub | None = (
            None
        )

    @property
    def _stub(self) -> notify_ingest_service_pb2_grpc.NotifyIngestServiceAsyncStub:
        if self._stub_instance is None:
            self._stub_instance = notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(
                self._client.channel
            )
        return self._stub_instance

    async def deliver(self, messages: Sequence[pb.OutboxMessage]) -> int:
        """How many of ``messages`` moved notify's projection; raises DeliveryFailed."""
        try:
            reply = await self._stub.Deliver(
                pb.DeliverRequest(messages=messages), **self._client.call_options()
            )
        except grpc.aio.AioRpcError as error:
            raise DeliveryFailed(RemoteFailure.of(error)) from None
        return int(reply.applied_count)

    async def close(self) -> None:
        await self._client.close()
        self._stub_instance = None
