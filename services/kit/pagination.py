"""Opaque page tokens and page sizes for List methods (AIP-158)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from services.kit.errors import ApiError, FieldViolation, Reason, invalid_argument


def page_size(requested: int, *, default: int, maximum: int) -> int:
    """0 means the default; above the maximum is coerced down; negative is an error."""
    if requested < 0:
        raise invalid_argument(
            Reason.INVALID_PAGE_SIZE, [FieldViolation("page_size", "must not be negative")]
        )
    return min(requested or default, maximum)


def encode_token(position: dict[str, Any]) -> str:
    raw = json.dumps(position, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def invalid_page_token(description: str = "is not a token from a previous call") -> ApiError:
    return invalid_argument(Reason.INVALID_PAGE_TOKEN, [FieldViolation("page_token", description)])


def decode_token(token: str, required: tuple[str, ...]) -> dict[str, Any]:
    """The position a token encodes; INVALID_ARGUMENT for anything we did not issue."""
    problem = invalid_page_token()
    try:
        padded = token + "=" * (-len(token) % 4)
        position = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise problem from None
    if not isinstance(position, dict) or any(key not in position for key in required):
        raise problem
    return position
