"""The metadata of the call being served, read from gRPC once per call.

``ServicerContext.invocation_metadata()`` builds a new tuple of the call's metadata on
every call (one object per entry, converted from the C core); the server stack reads it
for authentication, and a handler that wants a header (Idempotency-Key, Prefer) takes
the same tuple from here instead of building it again (py-spy: 9 % of creation's API
CPU on SubmitJob's path went to the second reading, docs/benchmarks.md 2026-12-04).
"""

from __future__ import annotations

import contextvars
from typing import Any

from grpc import aio

Metadata = tuple[tuple[str, str | bytes], ...]

_current: contextvars.ContextVar[Metadata | None] = contextvars.ContextVar(
    "call_metadata", default=None
)


def remember(metadata: Metadata) -> contextvars.Token[Metadata | None]:
    return _current.set(metadata)


def forget(token: contextvars.Token[Metadata | None]) -> None:
    _current.reset(token)


def call_metadata(context: aio.ServicerContext[Any, Any]) -> Metadata:
    """The call's metadata: as the server stack read it, else from gRPC."""
    found = _current.get()
    if found is not None:
        return found
    return tuple(context.invocation_metadata() or ())
