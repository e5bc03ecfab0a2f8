"""The one small interface media keeps objects behind. Keys are always made by media
(``model.object_key``); a backend never sees user input as a path."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

# How long a browser may keep a downloaded object when nothing else is said (the default
# window plus the default TTL); media passes what its settings make it.
DEFAULT_OBJECT_MAX_AGE_SECONDS = 3600 + 300


def object_cache_control(max_age_seconds: int) -> str:
    """What an object is served with: it never changes under its key (media never
    overwrites one), so a browser may keep it as long as its URL can work, for the user
    who fetched it only (``private``: a URL is the user's, not a shared resource)."""
    return f"private, max-age={max_age_seconds}, immutable"


@dataclass(frozen=True)
class Validity:
    """When a download URL is signed (the start of its window) and when it expires."""

    signed_at: datetime
    expires_at: datetime
    # When the window ends: reads from then on get the next window's URLs.
    window_ends_at: datetime


@dataclass(frozen=True)
class DownloadWindows:
    """Download URLs are signed for epoch-aligned windows, not for each read: every read
    within one window gets the same expiry and signing time, hence (the signature covering
    nothing else that changes) the same URL, so a client's image cache hits. A URL read at
    any moment of its window works at least ``ttl_seconds`` more: it expires ``ttl_seconds``
    after its window ends (at most ``window_seconds + ttl_seconds`` after it was signed)."""

    window_seconds: int
    ttl_seconds: int

    def at(self, now: datetime) -> Validity:
        start = int(now.timestamp()) // self.window_seconds * self.window_seconds
        return Validity(
            signed_at=datetime.fromtimestamp(start, UTC),
            expires_at=datetime.fromtimestamp(start + self.window_seconds + self.ttl_seconds, UTC),
            window_ends_at=datetime.fromtimestamp(start + self.window_seconds, UTC),
        )

    @property
    def longest_seconds(self) -> int:
        """The longest a URL works: from its window's start to its expiry."""
        return self.window_seconds + self.ttl_seconds

    @property
    def cache_control(self) -> str:
        return object_cache_control(self.longest_seconds)


class ObjectNotFound(Exception):
    """No object under the key."""


class ObjectExists(Exception):
    """An object is already stored under the key; media never overwrites one."""


@dataclass(frozen=True)
class ObjectStat:
    size_bytes: int
    # As stored with the object; None where the backend keeps none (local).
    content_type: str | None
    # The SHA-256 (hex) the store checked the upload against, when it reports one (S3
    # with a checksum; the local listener checks a signed hash before publishing).
    sha256: str | None = None


@dataclass(frozen=True)
class SignedRequest:
    """A request anyone holding it may make until it expires."""

    method: str
    url: str
    # Headers the request must carry exactly as given (the signature covers them).
    headers: dict[str, str] = field(default_factory=dict)


class WholeObject:
    """An object's bytes, all in memory, as the chunks a put takes: a backend may write
    them in one step rather than chunk by chunk."""

    def __init__(self, data: bytes, chunk_bytes: int) -> None:
        self.data = data
        self._chunk_bytes = chunk_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.data), self._chunk_bytes):
            yield self.data[start : start + self._chunk_bytes]


class ObjectStorage(Protocol):
    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        """Stores the bytes under a new key. Raises ObjectExists when the key is taken."""
        ...

    def stream(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The object's bytes in chunks of at most ``chunk_bytes``. Raises ObjectNotFound."""
        ...

    async def stat(self, key: str) -> ObjectStat | None: ...

    async def read_head(self, key: str, max_bytes: int) -> bytes:
        """The object's first ``max_bytes`` bytes (all of a smaller one), read without the
        rest. Raises ObjectNotFound."""
        ...

    async def delete(self, key: str) -> None:
        """Removes the object; removing a missing one succeeds."""
        ...

    async def presign_put(
        self,
        key: str,
        content_type: str,
        size_bytes: int,
        expires_at: datetime,
        sha256: str | None = None,
    ) -> SignedRequest:
        """A PUT that creates the object with exactly this content type and at most (S3:
        exactly) this many bytes, and never replaces an existing object. With ``sha256``
        (hex), the store refuses a body of other bytes: S3 checks the signed
        ``x-amz-checksum-sha256``, media's listener the signed hash, before the object
        appears."""
        ...

    async def presign_get(
        self,
        key: str,
        content_type: str,
        expires_at: datetime,
        signed_at: datetime | None = None,
    ) -> SignedRequest:
        """A GET of the object, answered with ``content_type`` and the backend's
        Cache-Control. With ``signed_at`` (a window's start, in the past), the URL is
        signed as of that moment: the same arguments give the same URL byte for byte,
        whenever asked (without, it is signed now)."""
        ...

    async def remove_abandoned_writes(self, older_than: datetime, limit: int) -> int:
        """Removes up to ``limit`` writes that were started but never finished (a crash,
        a lost connection) and are untouched since ``older_than``; returns how many."""
        ...

    async def close(self) -> None: ...
