"""Failed calls as typed exceptions: one class per status code, each carrying what the
server's ``google.rpc.Status`` said (the stable ``ErrorInfo.reason``, field violations, the
``RetryInfo`` delay).

The details travel in the ``grpc-status-details-bin`` trailer; they are parsed only when a
call has failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    """One bad request field, as ``google.rpc.BadRequest`` names it."""

    field: str
    description: str


class AtelierError(Exception):
    """A call failed. ``reason`` is the stable ``ErrorInfo.reason`` (empty when the
    failure came from the transport, not from atelier); ``retry_after`` is the
    ``RetryInfo`` delay in seconds, when the server gave one."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[FieldViolation] = (),
        retry_after: float | None = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: Mapping[str, str] = dict(metadata or {})
        self.field_violations = tuple(field_violations)
        self.retry_after = retry_after
        super().__init__(f"{self.code.name} {reason or '-'}: {message}")


class InvalidArgument(AtelierError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(AtelierError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AtelierError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AtelierError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(AtelierError):
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(AtelierError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(AtelierError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(AtelierError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(AtelierError, TimeoutError):
    """The call's deadline (or ``wait``'s timeout) passed before an answer."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(AtelierError):
    code = grpc.StatusCode.CANCELLED


class Internal(AtelierError):
    code = grpc.StatusCode.INTERNAL


class UploadFailed(AtelierError):
    """The bytes of an upload did not reach its signed URL (an HTTP failure, not gRPC)."""


_BY_CODE: dict[grpc.StatusCode, type[AtelierError]] = {
    kind.code: kind
    for kind in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        Internal,
    )
}
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: grpc.StatusCode, message: str, details: bytes | None) -> AtelierError:
    """The typed error for a status and its serialized ``google.rpc.Status`` (or None)."""
    fields: dict[str, Any] = {}
    if details:
        status = status_pb2.Status()
        try:
            status.ParseFromString(details)
        except Exception:
            status = status_pb2.Status()
        fields = _detail_fields(status)
    return _BY_CODE.get(code, AtelierError)(message, code=code, **fields)


def from_status_message(status: status_pb2.Status) -> AtelierError:
    """The typed error for a ``google.rpc.Status`` sent inside a stream."""
    code = _CODE_BY_NUMBER.get(status.code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, AtelierError)(status.message, code=code, **_detail_fields(status))


def from_rpc_error(error: grpc.RpcError) -> AtelierError:
    """The typed error for a failed call (sync or asyncio)."""
    call: Any = error  # a failed call is both the exception and its grpc.Call
    details = None
    for key, value in call.trailing_metadata() or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            details = value
    return from_status(call.code(), call.details() or "", details)


def _detail_fields(status: status_pb2.Status) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    violations: list[FieldViolation] = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        retry = error_details_pb2.RetryInfo()
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(info):
            fields.update(reason=info.reason, domain=info.domain, metadata=dict(info.metadata))
        elif detail.Unpack(retry):
            delay = retry.retry_delay
            fields["retry_after"] = delay.seconds + delay.nanos / 1e9
        elif detail.Unpack(bad):
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    if violations:
        fields["field_violations"] = violations
    return fields
