"""Signed URLs for the local backend, checked by media's own HTTP listener.

A signature is HMAC-SHA256, under a secret only media knows, over everything the URL
allows: the method, the key, the expiry, and the content type (and for PUT the largest
body, and the body's SHA-256 when the upload declared one). Change any of them and the
signature no longer verifies.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from enum import Enum
from urllib.parse import urlencode

# The path under which the HTTP listener (and the edge, in front of it) serves objects.
OBJECTS_PATH = "/media-objects/"


class Verdict(Enum):
    VALID = "valid"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"


class UrlSigner:
    def __init__(self, secret: str, public_base_url: str) -> None:
        self._secret = secret.encode()
        self._base = public_base_url.rstrip("/")

    def _signature(
        self,
        method: str,
        key: str,
        expires: int,
        content_type: str,
        size: int | None,
        sha256: str | None = None,
    ) -> str:
        # JSON keeps the fields apart unambiguously, whatever they contain. A URL without
        # a hash signs the fields it always did.
        fields: list[object] = [method, key, expires, content_type, size]
        if sha256 is not None:
            fields.append(sha256)
        message = json.dumps(fields).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def put_url(
        self, key: str, content_type: str, size: int, expires: int, sha256: str | None = None
    ) -> str:
        signature = self._signature("PUT", key, expires, content_type, size, sha256)
        params: dict[str, object] = {"expires": expires, "size": size}
        if sha256 is not None:
            params["sha256"] = sha256
        query = urlencode({**params, "signature": signature})
        return f"{self._base}{OBJECTS_PATH}{key}?{query}"

    def get_url(self, key: str, content_type: str, expires: int) -> str:
        signature = self._signature("GET", key, expires, content_type, None)
        query = urlencode({"expires": expires, "type": content_type, "signature": signature})
        return f"{self._base}{OBJECTS_PATH}{key}?{query}"

    def verify(
        self,
        method: str,
        key: str,
        *,
        expires: int,
        content_type: str,
        size: int | None,
        signature: str,
        now: float,
        sha256: str | None = None,
    ) -> Verdict:
        """The signature first: a tampered expiry is a bad signature, not an expiry. Any
        text is a signature that may not match (compare_digest refuses non-ASCII str)."""
        expected = self._signature(method, key, expires, content_type, size, sha256)
        given = signature.encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(expected.encode(), given):
            return Verdict.BAD_SIGNATURE
        if now >= expires:
            return Verdict.EXPIRED
        return Verdict.VALID
