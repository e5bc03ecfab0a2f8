"""Client idempotency keys: AIP-155's ``request_id`` field or the HTTP world's
Idempotency-Key header (the edge forwards it as gRPC metadata). One rule for every RPC
that takes them: either may be sent, both must then agree, and a key is 1 to
:data:`MAX_KEY_LENGTH` printable characters that need no escaping anywhere."""

from __future__ import annotations

import re
from typing import Any

from grpc import aio

from services.kit.call_metadata import call_metadata
from services.kit.errors import FieldViolation

HEADER = "idempotency-key"
MAX_KEY_LENGTH = 128
KEY_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
KEY_RULE = f"must be 1-{MAX_KEY_LENGTH} characters of letters, digits and . _ : -"


def choose_key(
    field: str, header: str | None, field_name: str = "request_id"
) -> tuple[str | None, list[FieldViolation]]:
    """The key from the request field or the header (None when neither is given), or the
    field violations that say why neither can be used."""
    field = field.strip()
    header = header.strip() if header else ""
    if field and header and field != header:
        return None, [
            FieldViolation(field_name, "differs from the Idempotency-Key header; send one")
        ]
    key = field or header
    if not key:
        return None, []
    if not KEY_PATTERN.fullmatch(key):
        return None, [FieldViolation(field_name, KEY_RULE)]
    return key, []


def header_key(context: aio.ServicerContext[Any, Any]) -> str | None:
    """The Idempotency-Key header's value, when the call carries one."""
    for name, value in call_metadata(context):
        if name == HEADER:
            return value.decode() if isinstance(value, bytes) else value
    return None
