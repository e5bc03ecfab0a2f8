"""A small typed client for atelier's public gRPC API, for internal services, tests and
benchmarks: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio), over the
generated stubs in gen/. It depends on gen/ and grpc only, never on the services' code.
See docs/client.md."""

from atelier_client.aio import AsyncClient
from atelier_client.errors import (
    AlreadyExists,
    AtelierError,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    UploadFailed,
)
from atelier_client.retry import NO_RETRY, RetryPolicy
from atelier_client.sync import Client
from atelier_client.watch import Job

__all__ = [
    "NO_RETRY",
    "AlreadyExists",
    "AsyncClient",
    "AtelierError",
    "Cancelled",
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "Job",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Unauthenticated",
    "Unavailable",
    "UploadFailed",
]
