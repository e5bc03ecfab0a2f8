"""How media's object listener answers when it does not serve an object: a JSON
``google.rpc.Status`` (``code``, ``message``, ``details`` with an ErrorInfo reason in our
domain) under the HTTP status that says what happened, ``error`` repeating the reason
for clients of the first version, and ``Retry-After`` when trying again later helps.
Also aiohttp's own refusals (a request line too long, not HTTP at all), which never reach
a handler."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from google.protobuf import json_format

from services.kit.errors import ApiError, internal
from services.kit.logging import get_logger
from services.media.errors import MediaError, Reason

log = get_logger(__name__)

# The gRPC code a refusal's body carries, by HTTP status (and back, for domain errors).
_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    411: grpc.StatusCode.INVALID_ARGUMENT,
    412: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}
_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.ABORTED: 409,  # contention in the database: retry at once
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 412,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
}


class Refused(Exception):
    """A request the listener will not serve, and the answer that says why."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = ApiError(_CODES.get(status, grpc.StatusCode.UNKNOWN), reason, message)


def answer(status: int, error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    body: dict[str, Any] = json_format.MessageToDict(error.to_status())
    body["error"] = error.reason
    extra = dict(headers or {})
    if error.retry_after_seconds is not None:
        extra["Retry-After"] = str(math.ceil(error.retry_after_seconds))
    log.info("object_request_refused", status=status, error=error.reason)
    return web.json_response(body, status=status, headers=extra)


def failure_answer(failure: MediaError) -> web.Response:
    """A domain failure (a dependency that did not answer) as the client sees it."""
    error = failure.to_api_error()
    return answer(_HTTP_STATUS.get(error.code, 500), error)


def internal_answer() -> web.Response:
    """A bug: no text from the exception (the log has it)."""
    return answer(500, internal())


class _JsonErrors(RequestHandler):
    """aiohttp's own refusals (a request line or header too long, not HTTP at all) as a
    JSON status too, logged in one line without the URL (it may carry a signature)."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("object_request_failed", error=type(exc).__name__)
            error = internal()
        else:
            error = Refused(status, Reason.MALFORMED_REQUEST, "not a valid HTTP request").error
        response = answer(status, error)
        response.force_close()
        return response


class ObjectServer(web.Server):
    """aiohttp's low-level server, whose connections answer their own errors as JSON."""

    def __init__(self, handler: Callable[[web.BaseRequest], Any], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._handler_kwargs = kwargs

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=asyncio.get_running_loop(), **self._handler_kwargs)
