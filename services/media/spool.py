"""Bytes on their way through media: counted and hashed as they pass, kept in memory while
small and in a temporary file past that. Nothing ever holds a whole large object.

Small objects (the usual generated image) never leave the event loop: hashing a few KB
costs less than handing it to a thread. Large chunks, and anything on disk, go to a
worker thread so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import IO

from services.kit.sizes import byte_size

# Chunks up to this size are hashed on the event loop (tens of microseconds).
INLINE_CHUNK_BYTES = 64 * 1024


class SpoolLimitExceeded(Exception):
    """More bytes arrived than the caller allows."""


@dataclass
class Spooled:
    file: IO[bytes]
    size: int
    sha256: str
    # The bytes are in ``file`` in memory (an io.BytesIO), not on disk.
    in_memory: bool = False

    def whole(self) -> bytes | None:
        """All the bytes, when they are in memory."""
        if isinstance(self.file, io.BytesIO):
            return self.file.getvalue()
        return None

    def close(self) -> None:
        self.file.close()


def _to_disk(buffer: io.BytesIO) -> IO[bytes]:
    file = tempfile.TemporaryFile()  # noqa: SIM115 - returned open
    try:
        file.write(buffer.getbuffer())
    except BaseException:
        file.close()
        raise
    return file


async def spool(chunks: AsyncIterable[bytes], *, max_bytes: int, memory_bytes: int) -> Spooled:
    """Reads ``chunks`` into memory, or a temporary file once past ``memory_bytes``,
    measuring size and SHA-256 on the way. Raises SpoolLimitExceeded as soon as
    ``max_bytes`` is passed, without reading further."""
    buffer = io.BytesIO()
    file: IO[bytes] = buffer
    in_memory = True
    digest = hashlib.sha256()
    size = 0

    def absorb(chunk: bytes) -> None:
        digest.update(chunk)
        file.write(chunk)

    try:
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise SpoolLimitExceeded(f"more than {byte_size(max_bytes)}")
            if in_memory and size > memory_bytes:
                file = await asyncio.to_thread(_to_disk, buffer)
                buffer.close()
                in_memory = False
            if in_memory and len(chunk) <= INLINE_CHUNK_BYTES:
                absorb(chunk)
            else:
                # Hashing a large chunk and writing to disk release the GIL: off the loop.
                await asyncio.to_thread(absorb, chunk)
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return Spooled(file=file, size=size, sha256=digest.hexdigest(), in_memory=in_memory)


async def read_chunks(spooled: Spooled, chunk_bytes: int) -> AsyncIterator[bytes]:
    """The spooled bytes from their start, in chunks; a file on disk is read off the
    event loop."""
    data = spooled.whole()
    if data is not None:
        for start in range(0, len(data), chunk_bytes):
            yield data[start : start + chunk_bytes]
        return
    file = spooled.file
    await asyncio.to_thread(file.seek, 0)
    while chunk := await asyncio.to_thread(file.read, chunk_bytes):
        yield chunk
