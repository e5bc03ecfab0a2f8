"""The one small interface media keeps objects behind. Keys are always made by media
(``model.object_key``); a backend never sees user input as a path."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


class ObjectNotFound(Exception):
    """No object under the key."""


class ObjectExists(Exception):
    """An object is already stored under the key; media never overwrites one."""


@dataclass(frozen=True)
class ObjectStat:
    size_bytes: int
    # As stored with the object; None where the backend keeps none (local).
    content_type: str | None


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

    async def delete(self, key: str) -> None:
        """Removes the object; removing a missing one succeeds."""
        ...

    async def presign_put(
        self, key: str, content_type: str, size_bytes: int, expires_at: datetime
    ) -> SignedRequest:
        """A PUT that creates the object with exactly this content type and at most (S3:
        exactly) this many bytes, and never replaces an existing object."""
        ...

    async def presign_get(self, key: str, content_type: str, expires_at: datetime) -> SignedRequest:
        """A GET of the object, answered with ``content_type``."""
        ...

    async def remove_abandoned_writes(self, older_than: datetime, limit: int) -> int:
        """Removes up to ``limit`` writes that were started but never finished (a crash,
        a lost connection) and are untouched since ``older_than``; returns how many."""
        ...

    async def close(self) -> None: ...
