"""Page sizes and opaque keyset page tokens for List methods (AIP-158).

A token is the position of the last item of a page: a few typed fields, which list it
belongs to, and the filters it was issued for, as URL-safe base64 of a small JSON object.
Clients can forge anything, so decoding checks every field before it can reach SQL: a
timestamp must be timezone-aware and inside what PostgreSQL and Python can both hold, an
id must be a UUID, an integer must be within its bounds. Anything else is
INVALID_PAGE_TOKEN, never a server error.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from services.kit.errors import ApiError, FieldViolation, Reason, invalid_argument
from services.kit.ids import canonical_uuid

# Our tokens are well under this; a longer one is forged and not worth decoding.
MAX_TOKEN_LENGTH = 512
# Python's datetime spans years 1-9999 and PostgreSQL's timestamptz more; a day's margin
# at both ends keeps any time zone offset from overflowing on the way to UTC.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
BIGINT_MAX = 2**63 - 1


def page_size(requested: int, *, default: int, maximum: int) -> int:
    """0 means the default; above the maximum is coerced down; negative is an error."""
    if requested < 0:
        raise invalid_argument(
            Reason.INVALID_PAGE_SIZE, [FieldViolation("page_size", "must not be negative")]
        )
    return min(requested or default, maximum)


def invalid_page_token(description: str = "is not a token from a previous call") -> ApiError:
    return invalid_argument(Reason.INVALID_PAGE_TOKEN, [FieldViolation("page_token", description)])


class _Refused(Exception):
    """A field of a decoded token is not acceptable."""


class KeyField(Protocol):
    def dump(self, value: Any) -> Any:
        """The value as JSON."""
        ...

    def load(self, raw: Any) -> Any:
        """The value from JSON; raises _Refused when it is not acceptable."""
        ...


@dataclass(frozen=True)
class Timestamp:
    """An aware datetime, kept as ISO 8601 in UTC."""

    def dump(self, value: datetime) -> str:
        return value.astimezone(UTC).isoformat()

    def load(self, raw: Any) -> datetime:
        if not isinstance(raw, str) or len(raw) > 40:
            raise _Refused
        try:
            parsed = datetime.fromisoformat(raw)
            if parsed.tzinfo is None:
                raise _Refused
            value = parsed.astimezone(UTC)
        except (ValueError, OverflowError):
            raise _Refused from None
        if not EARLIEST <= value <= LATEST:
            raise _Refused
        return value


@dataclass(frozen=True)
class Uuid:
    """A UUID in its canonical lowercase text form."""

    def dump(self, value: str) -> str:
        return value

    def load(self, raw: Any) -> str:
        parsed = canonical_uuid(raw) if isinstance(raw, str) else None
        if parsed is None:
            raise _Refused
        return parsed


@dataclass(frozen=True)
class Integer:
    """A whole number within bounds (by default a positive BIGINT)."""

    minimum: int = 1
    maximum: int = BIGINT_MAX

    def dump(self, value: int) -> int:
        return value

    def load(self, raw: Any) -> int:
        # bool is an int to Python, never to us.
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise _Refused
        if not self.minimum <= raw <= self.maximum:
            raise _Refused
        return raw


T = TypeVar("T")


class KeysetCodec(Generic[T]):
    """Encodes and decodes the positions of one list.

    ``position`` builds the list's cursor from the decoded fields (by name), and its
    attributes of the same names are what is encoded. ``list_name`` keeps a token of one
    list from being replayed on another; the ``binding`` passed to encode and decode is
    the list's filters (and parent), which must be the same on every page.
    """

    def __init__(self, list_name: str, position: Callable[..., T], **fields: KeyField) -> None:
        self._list = list_name
        self._position = position
        self._fields = fields

    def encode(self, position: T, binding: str = "") -> str:
        body: dict[str, Any] = {
            name: field.dump(getattr(position, name)) for name, field in self._fields.items()
        }
        body["_list"] = self._list
        body["_binding"] = binding
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, token: str, binding: str = "") -> T:
        body = _body(token)
        if body.get("_list") != self._list or set(body) != {*self._fields, "_list", "_binding"}:
            raise invalid_page_token()
        if body["_binding"] != binding:
            raise invalid_page_token("was issued for other filters; start from the first page")
        try:
            values = {name: field.load(body[name]) for name, field in self._fields.items()}
        except _Refused:
            raise invalid_page_token() from None
        return self._position(**values)


def _body(token: str) -> dict[str, Any]:
    if len(token) > MAX_TOKEN_LENGTH:
        raise invalid_page_token()
    try:
        padded = token + "=" * (-len(token) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    # RecursionError: deeply nested JSON, which no token of ours holds.
    except (binascii.Error, ValueError, UnicodeError, RecursionError):
        raise invalid_page_token() from None
    if not isinstance(body, dict):
        raise invalid_page_token()
    return body
