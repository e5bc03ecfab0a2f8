"""Bytes passing through media are counted and hashed on the way, kept in memory only
while small, and a stream that runs past its limit is cut off there."""

from __future__ import annotations

import hashlib
import io
from collections.abc import AsyncIterator

import pytest

from services.media.spool import SpoolLimitExceeded, read_chunks, spool


async def chunks_of(
    data: bytes, size: int, pulled: list[int] | None = None
) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        if pulled is not None:
            pulled.append(start)
        yield data[start : start + size]


async def test_size_and_hash_are_measured_while_spooling() -> None:
    data = bytes(range(256)) * 1000
    spooled = await spool(chunks_of(data, 1000), max_bytes=len(data), memory_bytes=4096)
    try:
        assert spooled.size == len(data)
        assert spooled.sha256 == hashlib.sha256(data).hexdigest()
        assert not spooled.in_memory
        assert b"".join([c async for c in read_chunks(spooled, 7000)]) == data
        assert all(len(c) <= 7000 for c in [c async for c in read_chunks(spooled, 7000)])
    finally:
        spooled.close()


async def test_large_streams_go_to_disk_not_memory() -> None:
    data = b"x" * 100_000
    spooled = await spool(chunks_of(data, 10_000), max_bytes=len(data), memory_bytes=16_384)
    try:
        assert not spooled.in_memory
        assert not isinstance(spooled.file, io.BytesIO)
        assert spooled.file.read() == data
    finally:
        spooled.close()
    small = await spool(chunks_of(b"tiny", 2), max_bytes=10, memory_bytes=16_384)
    assert small.in_memory
    assert isinstance(small.file, io.BytesIO)
    small.close()


async def test_small_streams_are_read_back_from_memory_in_chunks() -> None:
    data = bytes(range(256)) * 40
    spooled = await spool(chunks_of(data, 3000), max_bytes=len(data), memory_bytes=16_384)
    try:
        assert spooled.in_memory
        assert spooled.sha256 == hashlib.sha256(data).hexdigest()
        read = [c async for c in read_chunks(spooled, 4096)]
        assert b"".join(read) == data
        assert [len(c) for c in read] == [4096, 4096, len(data) - 8192]
    finally:
        spooled.close()


async def test_the_limit_stops_reading_at_once() -> None:
    pulled: list[int] = []
    with pytest.raises(SpoolLimitExceeded):
        await spool(chunks_of(b"y" * 10_000, 1000, pulled), max_bytes=2500, memory_bytes=1024)
    assert pulled == [0, 1000, 2000]
