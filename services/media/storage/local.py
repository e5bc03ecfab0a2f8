"""Objects as files under one directory, for `atelier dev` and single-node setups.

Writes go to a temporary file first and appear under their key in one atomic step, so a
reader never sees half an object, and an existing object is never replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from services.media.model import KEY_PATTERN
from services.media.storage.base import ObjectExists, ObjectNotFound, ObjectStat, SignedRequest
from services.media.storage.signing import UrlSigner

INCOMING = ".incoming"


class LocalStorage:
    def __init__(self, root: Path, signer: UrlSigner) -> None:
        self.root = root
        self.signer = signer
        (root / INCOMING).mkdir(parents=True, exist_ok=True)

    def path_of(self, key: str) -> Path:
        # Keys are ours, but a path is only ever built from one that has our shape.
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError("not an object key")
        return self.root / key

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        final = self.path_of(key)
        temporary = self.root / INCOMING / f"{uuid.uuid4()}.part"
        file = await asyncio.to_thread(temporary.open, "xb")
        try:
            try:
                async for chunk in chunks:
                    await asyncio.to_thread(file.write, chunk)
                await asyncio.to_thread(_flush_to_disk, file)
            finally:
                await asyncio.to_thread(file.close)
            await asyncio.to_thread(_publish, temporary, final)
        finally:
            await asyncio.to_thread(temporary.unlink, missing_ok=True)

    async def stream(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        path = self.path_of(key)
        try:
            file = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        try:
            while chunk := await asyncio.to_thread(file.read, chunk_bytes):
                yield chunk
        finally:
            await asyncio.to_thread(file.close)

    async def stat(self, key: str) -> ObjectStat | None:
        try:
            found = await asyncio.to_thread(self.path_of(key).stat)
        except FileNotFoundError:
            return None
        return ObjectStat(size_bytes=found.st_size, content_type=None)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.path_of(key).unlink, missing_ok=True)

    async def presign_put(
        self, key: str, content_type: str, size_bytes: int, expires_at: datetime
    ) -> SignedRequest:
        self.path_of(key)
        url = self.signer.put_url(key, content_type, size_bytes, int(expires_at.timestamp()))
        return SignedRequest("PUT", url, {"Content-Type": content_type})

    async def presign_get(self, key: str, content_type: str, expires_at: datetime) -> SignedRequest:
        self.path_of(key)
        url = self.signer.get_url(key, content_type, int(expires_at.timestamp()))
        return SignedRequest("GET", url)

    async def close(self) -> None:
        return None


def _flush_to_disk(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


def _publish(temporary: Path, final: Path) -> None:
    """Links the finished file under its key; fails if the key is taken (no overwrite)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise ObjectExists(final.name) from None
    with contextlib.suppress(OSError):
        # The new directory entry survives a crash too.
        directory = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
