"""One way for a service to call another's internal listener.

The channel is opened lazily (a grpc.aio channel belongs to the event loop that made it,
and services are assembled before their loop starts), carries the service credential,
reconnects within about a second of the peer coming back (gRPC's default backoff grows
to two minutes), pings idle connections, and retries only the methods the caller names as
idempotent, only on UNAVAILABLE, within each call's deadline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from services.kit.errors import STATUS_DETAILS_KEY

# Keepalive must stay above the servers' min_ping_interval_without_data (10 s in
# services.kit.server), or they answer with GOAWAY too_many_pings.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 15_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 1),
]

# Failures that say "not now" rather than "no": worth a retry later.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


def retry_config(service: str, idempotent_methods: Sequence[str]) -> str:
    """A service config that retries ``idempotent_methods`` on UNAVAILABLE (a call that
    never reached the peer or found it restarting) a few times with a short backoff."""
    if not idempotent_methods:
        return json.dumps({"methodConfig": []})
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": service, "method": m} for m in idempotent_methods],
                    "retryPolicy": {
                        "maxAttempts": 3,
                        "initialBackoff": "0.05s",
                        "maxBackoff": "0.3s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


@dataclass(frozen=True)
class RemoteFailure:
    """What a failed call said: its code, and the ErrorInfo reason and RetryInfo delay
    from its google.rpc.Status details when it carried them."""

    code: grpc.StatusCode
    reason: str
    retry_after_seconds: float | None

    @property
    def transient(self) -> bool:
        return self.code in TRANSIENT_CODES

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> RemoteFailure:
        reason = ""
        retry_after: float | None = None
        trailers: Any = error.trailing_metadata() or ()
        for key, value in trailers:
            if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
                continue
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # a peer's malformed details must not turn into our bug
                break
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                retry = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    reason = info.reason
                elif detail.Unpack(retry):
                    delay = retry.retry_delay
                    retry_after = delay.seconds + delay.nanos / 1e9
        return cls(error.code(), reason or error.code().name, retry_after)


class InternalClient:
    """A lazily opened channel to one peer's internal listener, with the service
    credential and a deadline for every call."""

    def __init__(
        self,
        address: str,
        service_token: str,
        *,
        service: str,
        idempotent_methods: Sequence[str] = (),
        timeout_seconds: float = 2.0,
    ) -> None:
        self._address = address
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {service_token}"),)
        self.timeout_seconds = timeout_seconds
        self._options = [
            *CHANNEL_OPTIONS,
            ("grpc.service_config", retry_config(service, idempotent_methods)),
        ]
        self._channel: grpc.aio.Channel | None = None

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._address, options=self._options)
        return self._channel

    def call_options(self) -> dict[str, Any]:
        """Keyword arguments for a stub call: credential and deadline."""
        return {"metadata": self.metadata, "timeout": self.timeout_seconds}

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None
