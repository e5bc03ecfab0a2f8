"""Bytes on their way through media: counted and hashed as they pass, kept in a temporary
file that stays in memory only while small. Nothing ever holds a whole object."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import IO


class SpoolLimitExceeded(Exception):
    """More bytes arrived than the caller allows."""


@dataclass
class Spooled:
    file: IO[bytes]
    size: int
    sha256: str

    def close(self) -> None:
        self.file.close()


async def spool(chunks: AsyncIterable[bytes], *, max_bytes: int, memory_bytes: int) -> Spooled:
    """Reads ``chunks`` into a temporary file (on disk past ``memory_bytes``), measuring
    size and SHA-256 on the way. Raises SpoolLimitExceeded as soon as ``max_bytes`` is
    passed, without reading further."""
    file = tempfile.SpooledTemporaryFile(max_size=memory_bytes)  # noqa: SIM115 - returned open
    digest = hashlib.sha256()
    size = 0

    def absorb(chunk: bytes) -> None:
        digest.update(chunk)
        file.write(chunk)

    try:
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise SpoolLimitExceeded(f"more than {max_bytes} bytes")
            # Hashing and a possible write to disk release the GIL: off the loop.
            await asyncio.to_thread(absorb, chunk)
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return Spooled(file=file, size=size, sha256=digest.hexdigest())


async def read_chunks(file: IO[bytes], chunk_bytes: int) -> AsyncIterator[bytes]:
    """The file from its start, in chunks, read off the event loop."""
    await asyncio.to_thread(file.seek, 0)
    while chunk := await asyncio.to_thread(file.read, chunk_bytes):
        yield chunk
