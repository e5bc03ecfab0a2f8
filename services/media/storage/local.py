"""Objects as files under one directory, for `atelier dev` and single-node setups.

Writes go to a temporary file first and appear under their key in one atomic step, so a
reader never sees half an object, and an existing object is never replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, ParamSpec, TypeVar

from services.media.domain import KEY_PATTERN
from services.media.errors import StorageUnavailable
from services.media.storage.base import (
    DEFAULT_OBJECT_MAX_AGE_SECONDS,
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    SignedRequest,
    WholeObject,
    object_cache_control,
)
from services.media.storage.signing import UrlSigner

INCOMING = ".incoming"
PART_SUFFIX = ".part"
# A read of at most this many bytes is done on the event loop itself (see _at_once).
SMALL_READ_BYTES = 256 * 1024

_P = ParamSpec("_P")
_T = TypeVar("_T")


async def _io(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Runs a blocking file operation off the event loop. The disk failing (full, gone,
    read-only, an I/O error) is StorageUnavailable, said the same way as S3 being down."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except OSError as error:
        raise StorageUnavailable() from error


def _at_once(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Runs a small file operation (a stat, or a read of at most SMALL_READ_BYTES, from
    the page cache as a rule) on the event loop: it takes microseconds, less than the
    trip to a thread and back it would otherwise cost (a futex hand-off each way and the
    GIL passed twice). Failures are said as _io says them. Writes never come here: they
    wait on the disk (fsync)."""
    try:
        return function(*args, **kwargs)
    except OSError as error:
        raise StorageUnavailable() from error


class LocalStorage:
    def __init__(
        self,
        root: Path,
        signer: UrlSigner,
        cache_control: str = object_cache_control(DEFAULT_OBJECT_MAX_AGE_SECONDS),
    ) -> None:
        """``cache_control``: what the HTTP listener serves objects with."""
        self.root = root
        self.signer = signer
        self.cache_control = cache_control
        (root / INCOMING).mkdir(parents=True, exist_ok=True)
        # The file operations take text paths: pathlib's joins and parses cost more than
        # the operations themselves on a job's path.
        self._root = str(root)
        self._incoming = os.path.join(self._root, INCOMING)

    def path_of(self, key: str) -> Path:
        return Path(self.file_of(key))

    def file_of(self, key: str) -> str:
        """The object's file, as a text path."""
        # Keys are ours, but a path is only ever built from one that has our shape.
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError("not an object key")
        return f"{self._root}/{key}"

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        final = self.file_of(key)
        temporary = f"{self._incoming}/{uuid.uuid4()}{PART_SUFFIX}"
        if isinstance(chunks, WholeObject):
            # All in memory: written, made durable and published in one trip to a thread.
            await _io(_write_whole, temporary, final, chunks.data)
            return
        file = await _io(open, temporary, "xb")
        try:
            try:
                # The chunks' own failures (a client that went away) pass unchanged.
                async for chunk in chunks:
                    await _io(file.write, chunk)
                await _io(_flush_to_disk, file)
            finally:
                await _io(file.close)
            await _io(_publish, temporary, final)
        finally:
            await _io(_unlink_if_present, temporary)

    async def stream(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        path = self.file_of(key)
        # Opening and the first read share one step: on the loop when that read is small
        # (a small object is then whole, its file already closed), else one trip to a
        # thread.
        if chunk_bytes <= SMALL_READ_BYTES:
            opened = _at_once(_open_and_read, path, chunk_bytes)
        else:
            opened = await _io(_open_and_read, path, chunk_bytes)
        if opened is None:
            raise ObjectNotFound(key)
        file, chunk = opened
        try:
            while chunk:
                yield chunk
                if file is None:
                    return
                chunk = await _io(file.read, chunk_bytes)
        finally:
            if file is not None:
                await _io(file.close)

    async def stat(self, key: str) -> ObjectStat | None:
        size = _at_once(_size_if_present, self.file_of(key))
        return None if size is None else ObjectStat(size_bytes=size, content_type=None)

    async def read_head(self, key: str, max_bytes: int) -> bytes:
        path = self.file_of(key)
        if max_bytes <= SMALL_READ_BYTES:
            head = _at_once(_read_head, path, max_bytes)
        else:
            head = await _io(_read_head, path, max_bytes)
        if head is None:
            raise ObjectNotFound(key)
        return head

    async def delete(self, key: str) -> None:
        await _io(_unlink_if_present, self.file_of(key))

    async def remove_abandoned_writes(self, older_than: datetime, limit: int) -> int:
        """Removes up to ``limit`` unfinished writes (``.incoming/*.part``, left by a crash)
        untouched since ``older_than``; a write in progress keeps its file fresh. Returns
        how many were removed."""
        return await _io(_remove_stale_parts, self._incoming, older_than.timestamp(), limit)

    async def presign_put(
        self,
        key: str,
        content_type: str,
        size_bytes: int,
        expires_at: datetime,
        sha256: str | None = None,
    ) -> SignedRequest:
        self.file_of(key)
        url = self.signer.put_url(
            key, content_type, size_bytes, int(expires_at.timestamp()), sha256=sha256
        )
        return SignedRequest("PUT", url, {"Content-Type": content_type})

    async def presign_get(
        self,
        key: str,
        content_type: str,
        expires_at: datetime,
        signed_at: datetime | None = None,
    ) -> SignedRequest:
        """The signature covers the key, type and expiry only: the same ones always give
        the same URL, whenever it was signed (``signed_at`` changes nothing here)."""
        self.file_of(key)
        url = self.signer.get_url(key, content_type, int(expires_at.timestamp()))
        return SignedRequest("GET", url)

    async def close(self) -> None:
        return None


def _write_whole(temporary: str, final: str, data: bytes) -> None:
    """The steps of a streamed put, for bytes already in memory."""
    try:
        with open(temporary, "xb") as file:
            file.write(data)
            _flush_to_disk(file)
        _publish(temporary, final)
    finally:
        _unlink_if_present(temporary)


def _unlink_if_present(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _open_and_read(path: str, chunk_bytes: int) -> tuple[BinaryIO | None, bytes] | None:
    """None for a missing object; else its first chunk, and the file to read on from
    (None when the first chunk was the whole object: the file is closed)."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed here or by the caller
    except FileNotFoundError:
        return None
    try:
        chunk = file.read(chunk_bytes)
    except BaseException:
        file.close()
        raise
    if len(chunk) < chunk_bytes:
        file.close()
        return None, chunk
    return file, chunk


def _read_head(path: str, max_bytes: int) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(max_bytes)
    except FileNotFoundError:
        return None


def _size_if_present(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _remove_stale_parts(incoming: str, cutoff: float, limit: int) -> int:
    removed = 0
    with os.scandir(incoming) as entries:
        for entry in entries:
            if removed >= limit:
                break
            if not entry.name.endswith(PART_SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue  # its write finished (or another sweep removed it) meanwhile
            removed += 1
    return removed


def _flush_to_disk(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


def _publish(temporary: str, final: str) -> None:
    """Links the finished file under its key; fails if the key is taken (no overwrite)."""
    folder = os.path.dirname(final)
    try:
        try:
            os.link(temporary, final)
        except FileNotFoundError:
            # The key's directory (a month's) is made by its first object.
            os.makedirs(folder, exist_ok=True)
            os.link(temporary, final)
    except FileExistsError:
        raise ObjectExists(os.path.basename(final)) from None
    with contextlib.suppress(OSError):
        # The new directory entry survives a crash too.
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
