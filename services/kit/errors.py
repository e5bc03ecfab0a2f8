"""API errors as ``google.rpc.Status`` with ``ErrorInfo``, ``BadRequest`` and ``RetryInfo``.

Handlers raise :class:`ApiError`; the server's error interceptor turns it into the status
the client sees. Reasons are contract: never reuse or rename one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "atelier.dev"
STATUS_DETAILS_KEY = "grpc-status-details-bin"

# An error's details travel in the trailers (grpc-status-details-bin, base64) beside
# grpc-message, and gRPC clients refuse trailers past 8 KiB at random (16 KiB always), as
# RESOURCE_EXHAUSTED without a reason. These bounds keep any answer under about 6 KiB:
# the first violations, then one that counts the rest, each text clipped.
MAX_VIOLATIONS = 20
MAX_FIELD_BYTES = 100
MAX_DESCRIPTION_BYTES = 200
VIOLATIONS_BUDGET_BYTES = 2048
MAX_MESSAGE_BYTES = 512
_ELLIPSIS = "…".encode()


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass
class ApiError(Exception):
    """An error the client is meant to see, with a stable reason."""

    code: grpc.StatusCode
    reason: str
    message: str
    violations: Sequence[FieldViolation] = ()
    retry_after_seconds: float | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = clip(self.message, MAX_MESSAGE_BYTES)
        if self.code == grpc.StatusCode.ABORTED and self.retry_after_seconds is None:
            # ABORTED means "send the same request again": it always says when (0: at
            # once), so an HTTP client tells it from ALREADY_EXISTS (both 409, never
            # retried) by `retry-after` alone (docs/edge.md).
            self.retry_after_seconds = 0.0
        super().__init__(f"{self.code.name} {self.reason}: {self.message}")

    def to_status(self) -> status_pb2.Status:
        details = []
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN)
        info.metadata.update(self.metadata)
        details.append(info)
        if self.violations:
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=v.field, description=v.description, reason=self.reason
                        )
                        for v in bounded_violations(self.violations)
                    ]
                )
            )
        if self.retry_after_seconds is not None:
            whole = math.ceil(self.retry_after_seconds)
            details.append(
                error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=whole))
            )
        packed = []
        for detail in details:
            wrapper = any_pb2.Any()
            wrapper.Pack(detail)
            packed.append(wrapper)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=packed)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ((STATUS_DETAILS_KEY, self.to_status().SerializeToString()),)

    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        """Response headers that help HTTP clients (``retry-after``)."""
        if self.retry_after_seconds is None:
            return ()
        return (("retry-after", str(math.ceil(self.retry_after_seconds))),)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 (whole characters), marked with an
    ellipsis when cut."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    return encoded[: max_bytes - len(_ELLIPSIS)].decode(errors="ignore") + "…"


def bounded_violations(violations: Sequence[FieldViolation]) -> tuple[FieldViolation, ...]:
    """The first violations that fit the bounds, each clipped, then one that says how
    many more there were."""
    shown: list[FieldViolation] = []
    spent = 0
    for violation in violations[:MAX_VIOLATIONS]:
        clipped = FieldViolation(
            clip(violation.field, MAX_FIELD_BYTES),
            clip(violation.description, MAX_DESCRIPTION_BYTES),
        )
        spent += len(clipped.field.encode()) + len(clipped.description.encode())
        if spent > VIOLATIONS_BUDGET_BYTES:
            break
        shown.append(clipped)
    hidden = len(violations) - len(shown)
    if hidden:
        shown.append(FieldViolation("", f"and {hidden} more violations not shown"))
    return tuple(shown)


class DomainError(Exception):
    """A failure a service's domain names. Each subclass says how a client sees it, so the
    service keeps its whole error table in one module; the server maps it on the way out."""

    def to_api_error(self) -> ApiError:
        raise NotImplementedError(f"{type(self).__name__} has no API form")


def invalid_argument(reason: str, violations: Sequence[FieldViolation]) -> ApiError:
    shown = bounded_violations(violations)
    summary = "; ".join(f"{v.field}: {v.description}" if v.field else v.description for v in shown)
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, reason, summary, violations=violations)


def not_found(reason: str, message: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, reason, message)


def unauthenticated(reason: str, message: str) -> ApiError:
    return ApiError(grpc.StatusCode.UNAUTHENTICATED, reason, message)


def internal() -> ApiError:
    """What an unexpected failure looks like to a client: no text from the exception."""
    return ApiError(grpc.StatusCode.INTERNAL, "INTERNAL", "internal error")


def unimplemented() -> ApiError:
    return ApiError(grpc.StatusCode.UNIMPLEMENTED, "NOT_IMPLEMENTED", "not implemented yet")


class Reason:
    """Reasons shared by every service. Service-specific reasons live with the service."""

    TOKEN_MISSING = "TOKEN_MISSING"
    TOKEN_MALFORMED = "TOKEN_MALFORMED"
    TOKEN_EXPIRED = "TOKEN_EXPIRED"
    TOKEN_INVALID = "TOKEN_INVALID"
    # UNAVAILABLE: the token's issuer is trusted but its keys cannot be had now (its JWKS
    # endpoint failed for longer than ATELIER_JWKS_MAX_STALE, or never answered yet).
    IDENTITY_PROVIDER_UNAVAILABLE = "IDENTITY_PROVIDER_UNAVAILABLE"
    SERVICE_CREDENTIAL_MISSING = "SERVICE_CREDENTIAL_MISSING"
    SERVICE_CREDENTIAL_INVALID = "SERVICE_CREDENTIAL_INVALID"
    # PERMISSION_DENIED: a known internal caller asked for an RPC its identity's policy
    # (ATELIER_SERVICE_IDENTITIES) does not grant; metadata names the identity and method.
    RPC_NOT_PERMITTED = "RPC_NOT_PERMITTED"
    # PERMISSION_DENIED: atelier-on-behalf-of from a caller that may not act for users
    # (a user token, or an identity without act_for_users).
    ON_BEHALF_OF_NOT_PERMITTED = "ON_BEHALF_OF_NOT_PERMITTED"
    # INVALID_ARGUMENT: atelier-on-behalf-of does not name a user id by the id rule.
    ON_BEHALF_OF_INVALID = "ON_BEHALF_OF_INVALID"
    INVALID_PAGE_SIZE = "INVALID_PAGE_SIZE"
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"
    # The request's bytes do not parse as the method's request message.
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
