"""What runs around every RPC (:class:`ServerStack`). It wraps each method handler so that
it runs inside the RPC's own task: errors can be turned into rich statuses, and the
caller's identity is visible to the handler through a context variable.

Order (outermost first): the RPC's span (only while tracing is on) → observability
(metrics, access log, error table) → authentication → the call's deadline → handler.
:func:`services.kit.server.build_stack` builds it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from grpc import aio
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from services.kit import deadlines, metrics
from services.kit.auth import (
    Authenticator,
    KeysPending,
    authenticator_for,
    reset_principal,
    set_principal,
)
from services.kit.call_metadata import forget, remember
from services.kit.deadlines import CallDeadline, budget_seconds
from services.kit.errors import ApiError, DomainError, Reason, internal, unimplemented
from services.kit.logging import get_logger
from services.kit.outages import DependencyUnavailable, Throttle, classify, log_unavailable
from services.kit.tracing import context_from_metadata

log = get_logger(__name__)

# Standard services that answer without credentials: probes and tooling need them.
UNAUTHENTICATED_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

if TYPE_CHECKING:
    # grpc-stubs types method handlers for the synchronous API only; with grpc.aio the
    # behaviours are coroutines and async generators. The generic forms exist only for
    # the type checker.
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Context: TypeAlias = aio.ServicerContext[Any, Any]
    GenericHandler: TypeAlias = grpc.GenericRpcHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Context = aio.ServicerContext
    GenericHandler = grpc.GenericRpcHandler
UnaryBehavior = Callable[[Any, Context], Awaitable[Any]]
# A step that runs around a call: it gets the context and a thunk that runs the rest.
Around = Callable[[Context, Callable[[], Awaitable[None]]], Awaitable[None]]


class _Unparsable:
    """Stands in for a request whose bytes did not parse. The innermost handler wrapper
    turns it into the client's error after authentication; any other use of it (a
    handler that reads a stream with ``context.read()``) raises the same error."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise malformed_request()


UNPARSABLE = _Unparsable()


def malformed_request() -> ApiError:
    # No parser text: it names internal classes and helps nobody.
    return ApiError(
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.MALFORMED_REQUEST,
        "the request does not parse as this method's request message",
    )


class _TolerantParser:
    """A request deserializer that returns UNPARSABLE instead of raising: grpc answers
    an exception from a deserializer with UNKNOWN and the exception's text."""

    def __init__(self, parse: Callable[[bytes], Any]) -> None:
        self._parse = parse

    def __call__(self, data: bytes) -> Any:
        try:
            return self._parse(data)
        except Exception:
            return UNPARSABLE


class _PassingBytes:
    """A streaming method's response serializer that sends a message already serialized
    (bytes) as it is: a stream handler may yield the bytes of its response message, so
    that one message sent to thousands of streams is serialized once. The wire carries
    the same bytes either way."""

    __slots__ = ("_serialize",)

    def __init__(self, serialize: Callable[[Any], bytes]) -> None:
        self._serialize = serialize

    def __call__(self, message: Any) -> bytes:
        if type(message) is bytes:
            return message
        return self._serialize(message)


def _parsed(request: Any) -> Any:
    if request is UNPARSABLE:
        raise malformed_request()
    return request


async def _parsed_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    # The call's deadline does not run while it waits for the client's next message.
    iterator = aiter(requests)
    while True:
        deadline = deadlines.current()
        if deadline is not None:
            deadline.pause()
        try:
            request = await anext(iterator)
        except StopAsyncIteration:
            return
        finally:
            if deadline is not None:
                deadline.resume()
        yield _parsed(request)


class _FirstMessageLifts:
    """A streaming call's context whose first write lifts the call's deadline: the
    deadline bounds a stream's setup, not its life. Everything else is the call's own."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._lifted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def write(self, message: Any) -> Awaitable[None]:
        if not self._lifted:
            self._lifted = True
            deadline = deadlines.current()
            if deadline is not None:
                deadline.lift()
        return self._context.write(message)


def wrap_handler(handler: Handler, around: Around) -> Handler:
    """Runs ``around`` around every call of ``handler``, unary or streaming alike.

    The first wrapper around a servicer's own handler also makes its request parsing
    tolerant and checks each request inside ``around``: a request that does not parse is
    INVALID_ARGUMENT (MALFORMED_REQUEST), seen by every interceptor like any other error.
    It also keeps the call's deadline to the service's own time (kit.deadlines): stopped
    while a client stream's next message is awaited, lifted at a stream's first message.
    """
    parse = handler.request_deserializer
    checks = parse is not None and not isinstance(parse, _TolerantParser)
    streamed_requests = handler.stream_unary is not None or handler.stream_stream is not None
    streamed_responses = handler.unary_stream is not None or handler.stream_stream is not None
    serialize = handler.response_serializer
    kwargs: dict[str, Any] = {
        "request_deserializer": _TolerantParser(parse) if checks and parse else parse,
        "response_serializer": _PassingBytes(serialize)
        if streamed_responses and serialize is not None and not isinstance(serialize, _PassingBytes)
        else serialize,
    }

    def checked(request: Any) -> Any:
        if not checks:
            return request
        return _parsed_stream(request) if streamed_requests else _parsed(request)

    unary_inner: UnaryBehavior | None = handler.unary_unary or handler.stream_unary  # type: ignore[assignment]
    if unary_inner is not None:
        inner = unary_inner

        async def unary(request: Any, context: Context) -> Any:
            result: list[Any] = []

            async def call() -> None:
                result.append(await inner(checked(request), context))

            await around(context, call)
            return result[0]

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)

    stream_inner: Any = handler.unary_stream or handler.stream_stream

    async def streaming(request: Any, context: Context) -> None:
        # Messages go out through context.write so that `around` sees every failure,
        # including one after the first message. An inner wrapper is already a writer.
        async def call() -> None:
            writer: Any = context if not checks else _FirstMessageLifts(context)
            produced = stream_inner(checked(request), writer)
            if inspect.isasyncgen(produced):
                async for message in produced:
                    await writer.write(message)
            else:
                await produced

        await around(context, call)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)


class ServerStack:
    """What runs around every RPC, in this order: its span when a tracer is given (child
    of the caller's ``traceparent``), observability (counts and times it by
    method and status code, logs it, maps exceptions to statuses), then authentication
    (every call but health and reflection; the principal reaches the handler through
    :func:`services.kit.auth.current_principal`), then the call's deadline
    (:mod:`services.kit.deadlines`), then the handler.

    Exceptions map to statuses in one place: ApiError to its own status, a dependency
    outage to UNAVAILABLE naming it (one throttled line per kind, no stack), anything
    unexpected to INTERNAL with generic text (the stack goes to the log, never to the
    client).

    The stack is applied once per method, when a servicer is registered (see
    :class:`StackedServer`), not by grpc.aio interceptors: those rebuild the handler
    chain on every call, which cost a cheap RPC more than its own work."""

    def __init__(
        self,
        service: str,
        authenticator: Authenticator,
        throttle: Throttle | None = None,
        tracer: Tracer | None = None,
        call_deadline_seconds: float | None = None,
    ) -> None:
        self._service = service
        self._authenticator = authenticator
        self._throttle = throttle or Throttle()
        self._tracer = tracer
        # None: calls have the client's deadline only (kit.deadlines).
        self._call_deadline = call_deadline_seconds

    def wrap(self, method: str, handler: Handler) -> Handler:
        authenticate = authenticator_for(self._authenticator, method).authenticate
        public = method.startswith(UNAUTHENTICATED_PREFIXES)
        service = self._service
        call_deadline = self._call_deadline

        async def around(context: Context, call: Callable[[], Awaitable[None]]) -> None:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            failure: ApiError | None = None
            metadata = () if public else tuple(context.invocation_metadata() or ())
            try:
                if public:
                    await call()
                else:
                    try:
                        principal = authenticate(metadata)
                    except KeysPending as pending:
                        # Rare (a new signing key, the first fetch): the hot path stays
                        # synchronous, this call waits for the one refresh under way.
                        await pending.wait()
                        try:
                            principal = authenticate(metadata)
                        except KeysPending as again:
                            raise again.otherwise from None
                    token = set_principal(principal)
                    read = remember(metadata)
                    try:
                        if call_deadline is None:
                            await call()
                        else:
                            budget = budget_seconds(call_deadline, context.time_remaining())
                            async with CallDeadline(budget):
                                await call()
                    finally:
                        forget(read)
                        reset_principal(token)
                code = context.code() or grpc.StatusCode.OK
            except aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as error:
                failure = api_error_of(error, method, self._throttle)
            finally:
                # Counted and logged before the status goes out: a client that has its
                # answer can read the metric.
                if failure is not None:
                    code = failure.code
                elapsed = time.perf_counter() - started
                metrics.observe_rpc(service, method, code.name, elapsed)
                if not public:
                    # The edge's request id and the client address it determined tie this
                    # line to the edge's access log line.
                    log.info(
                        "rpc_finished",
                        method=method,
                        code=code.name,
                        seconds=round(elapsed, 6),
                        request_id=_header(metadata, "x-request-id"),
                        client=_header(metadata, "x-forwarded-for"),
                    )
            if failure is not None:
                await _abort(context, failure)

        # Probes and tooling (health, reflection) make no spans: they would drown the rest.
        if self._tracer is not None and not public:
            return wrap_handler(handler, _traced(around, self._tracer, method))
        return wrap_handler(handler, around)


# Server-side codes that mean the server failed (OpenTelemetry's RPC conventions); the
# others are the caller's problem and leave the span's status unset.
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _traced(around: Around, tracer: Tracer, method: str) -> Around:
    """``around`` inside a SERVER span named for ``method``, child of the caller's span
    when its metadata carries a ``traceparent`` (through the edge, the app's own); the
    handler runs with it current, so what it calls and stores joins the trace."""
    service, _, name = method.lstrip("/").partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
    span_name = method.lstrip("/")

    async def traced(context: Context, call: Callable[[], Awaitable[None]]) -> None:
        parent = context_from_metadata(tuple(context.invocation_metadata() or ()))
        with tracer.start_as_current_span(
            span_name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            code = grpc.StatusCode.UNKNOWN
            try:
                await around(context, call)
                code = context.code() or grpc.StatusCode.OK
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                span.set_attribute("rpc.grpc.status_code", code.value[0])
                if code in _SERVER_FAULTS:
                    span.set_status(Status(StatusCode.ERROR, code.name))

    return traced


class _StackedGenericHandler(GenericHandler):
    """A servicer's generic handler whose method handlers come wrapped in the stack, each
    wrapped once, the first time its method is called."""

    def __init__(self, inner: GenericHandler, stack: ServerStack) -> None:
        self._inner = inner
        self._stack = stack
        # Only methods the servicer has: an unknown name is not remembered.
        self._wrapped: dict[str, Handler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            wrapped = self._wrapped[method] = self._stack.wrap(method, handler)
        return wrapped


class StackedServer:
    """Stands in for a grpc.aio server while servicers, health and reflection register
    (``add_XServicer_to_server(servicer, StackedServer(server, stack))``): each method
    handler they add is wrapped in ``stack``."""

    def __init__(self, server: aio.Server, stack: ServerStack) -> None:
        self._server = server
        self._stack = stack

    def add_generic_rpc_handlers(self, handlers: Sequence[GenericHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_StackedGenericHandler(handler, self._stack) for handler in handlers)
        )

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Handler]
    ) -> None:
        # grpc-stubs does not know this method yet.
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]
            service_name,
            {
                name: self._stack.wrap(f"/{service_name}/{name}", handler)
                for name, handler in method_handlers.items()
            },
        )


def _header(metadata: Sequence[tuple[str, str | bytes]], name: str) -> str | None:
    for key, value in metadata:
        if key == name and isinstance(value, str):
            return value
    return None


def api_error_of(error: Exception, method: str, throttle: Throttle) -> ApiError:
    """What a client sees for an exception a handler raised: an ApiError as it is, a
    domain failure in its API form, a dependency that did not answer as UNAVAILABLE, any
    other failure as INTERNAL (logged with its stack here, never shown). The one mapping
    for a call's status and for each item of a batched call (services.kit.batches)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, DomainError):
        return _api_form(error, method, throttle)
    if isinstance(error, NotImplementedError):
        return unimplemented()
    outage = classify(error)
    if outage is None:
        log.exception("rpc_failed", method=method)
        return internal()
    error_name = type(error).__name__
    log_unavailable(throttle, outage.dependency, outage.kind, method=method, error=error_name)
    return outage.api_error()


def _api_form(failure: DomainError, method: str, throttle: Throttle) -> ApiError:
    """The client's view of a domain failure; a failure with no mapping is a bug, shown as
    INTERNAL like any other (never as UNKNOWN with its text)."""
    if isinstance(failure, DependencyUnavailable):
        log_unavailable(
            throttle, failure.dependency, failure.cause or failure.reason, method=method
        )
    try:
        return failure.to_api_error()
    except Exception:
        log.exception("domain_error_unmapped", method=method, error=type(failure).__name__)
        return internal()


async def _abort(context: Context, error: ApiError) -> None:
    headers = error.initial_metadata()
    trailers = error.trailing_metadata()
    if headers:
        try:
            await context.send_initial_metadata(headers)
        except Exception:
            # A stream that already sent messages has sent its headers too (grpc raises
            # its private UsageError); the hint then rides in the trailers.
            trailers = (*trailers, *headers)
    await context.abort(error.code, error.message, trailing_metadata=trailers)
