"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` with
the endpoint's secret (``whsec_`` + base64 of its key bytes), and one more with the
previous secret while a rotation's overlap lasts (space-separated, as the standard has
it). Secrets are never logged."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh secret: 32 random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def key_of(secret: str) -> bytes:
    raw = secret.removeprefix(PREFIX)
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    keys: tuple[bytes, ...], message_id: str, timestamp: int, body: bytes
) -> list[tuple[str, str]]:
    """The headers of one attempt: ``keys`` are the current secret's, then the previous
    one's while it is valid."""
    signatures = " ".join(signature(key, message_id, timestamp, body) for key in keys)
    return [
        ("content-type", "application/json"),
        ("webhook-id", message_id),
        ("webhook-timestamp", str(timestamp)),
        ("webhook-signature", signatures),
    ]
