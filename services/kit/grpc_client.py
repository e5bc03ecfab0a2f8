"""One way for a service to call another's internal listener.

The channel is opened lazily (a grpc.aio channel belongs to the event loop that made it,
and services are assembled before their loop starts), carries the service credential,
reconnects within about a second of the peer coming back (gRPC's default backoff grows
to two minutes), pings idle connections, and retries only the methods the caller names as
idempotent, only on UNAVAILABLE, within each call's deadline. While tracing is on, each
call is a CLIENT span whose context goes to the peer as ``traceparent`` metadata.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from services.kit import deadlines, tracing
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
        trailers: Any = error.trailing_metadata() or ()
        for key, value in trailers:
            if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
                continue
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # a peer's malformed details must not turn into our bug
                break
            return cls._with_details(error.code(), status)
        return cls(error.code(), error.code().name, None)

    @classmethod
    def of_status(cls, status: status_pb2.Status) -> RemoteFailure:
        """An item's failure in a batched answer (a google.rpc.Status of its own)."""
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        return cls._with_details(code, status)

    @classmethod
    def _with_details(cls, code: grpc.StatusCode, status: status_pb2.Status) -> RemoteFailure:
        reason = ""
        retry_after: float | None = None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            retry = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                reason = info.reason
            elif detail.Unpack(retry):
                delay = retry.retry_delay
                retry_after = delay.seconds + delay.nanos / 1e9
        return cls(code, reason or code.name, retry_after)


# A status's number, as gRPC's own code.
_CODES = {code.value[0]: code for code in grpc.StatusCode}


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
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._address = address
        # None: plaintext; else mutual TLS to the peer (services.kit.internal_tls).
        self._tls = tls
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
            tracer = tracing.tracer()
            # No interceptor at all while tracing is off: grpc.aio runs an intercepted
            # call in a task of its own.
            interceptors = None if tracer is None else tracing_interceptors(tracer)
            if self._tls is None:
                self._channel = grpc.aio.insecure_channel(
                    self._address, options=self._options, interceptors=interceptors
                )
            else:
                self._channel = grpc.aio.secure_channel(
                    self._address, self._tls, options=self._options, interceptors=interceptors
                )
        return self._channel

    def call_options(self) -> dict[str, Any]:
        """Keyword arguments for a stub call: credential and deadline (within the time
        the running call has left, so that this call's failure is its answer)."""
        return {"metadata": self.metadata, "timeout": deadlines.within(self.timeout_seconds)}

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None


def tracing_interceptors(tracer: Tracer) -> list[Any]:
    """Make each call a CLIENT span, child of the caller's current span, and send its
    context as ``traceparent`` so the peer's SERVER span is its child. A call with one
    answer ends its span before the caller sees the answer; a response stream, once the
    caller has read it all (or closed it). One object per kind of call: a channel files
    an interceptor under the first kind it implements only."""
    return [_UnaryUnary(tracer), _UnaryStream(tracer), _StreamUnary(tracer)]


class _Tracing:
    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    async def _start(self, continuation: Any, details: Any, request: Any) -> tuple[Span, Any]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, _, name = method.lstrip("/").partition("/")
        span = self._tracer.start_span(
            method.lstrip("/"),
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        traced = grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*tracing.with_traceparent(details.metadata or (), span)),
            details.credentials,
            details.wait_for_ready,
        )
        try:
            return span, await continuation(traced, request)
        except BaseException:
            span.set_status(Status(StatusCode.ERROR))
            span.end()
            raise

    async def _one_answer(self, continuation: Any, details: Any, request: Any) -> Any:
        span, call = await self._start(continuation, details, request)
        await _end_span(span, call)
        return call


class _UnaryUnary(_Tracing, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    intercept_unary_unary = _Tracing._one_answer  # type: ignore[assignment]


class _StreamUnary(_Tracing, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    intercept_stream_unary = _Tracing._one_answer  # type: ignore[assignment]


class _UnaryStream(_Tracing, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        span, call = await self._start(continuation, client_call_details, request)
        return _read_then_end(span, call)


async def _read_then_end(span: Span, call: Any) -> AsyncIterator[Any]:
    """The call's responses; its span ends after the last (or when the caller gives up
    and the iterator is closed)."""
    try:
        async for response in call:
            yield response
    finally:
        await _end_span(span, call)


async def _end_span(span: Span, call: Any) -> None:
    try:
        code: grpc.StatusCode = await call.code()
    except asyncio.CancelledError:
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
        span.set_status(Status(StatusCode.ERROR, "CANCELLED"))
        span.end()
        raise
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.end()
