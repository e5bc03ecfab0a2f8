"""creation's object client against a store process that is frozen (SIGSTOP) while it
holds its port: the kernel still takes the connection and buffers what fits, then nothing
more is read. An upload must end by its deadline as the store being unavailable (the job
handed back), never wait for ever (aiohttp times reads and connects, not writes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from services.creation import object_transfer
from services.creation.errors import MediaUnavailable
from services.creation.media_client import OutputUpload
from services.creation.object_transfer import ObjectTransfer
from services.dev.processes import free_port

# More than loopback's socket buffers take, so the upload's writes block.
OUTPUT = b"x" * (48 << 20)


@pytest.fixture
def frozen_store() -> Iterator[str]:
    port = free_port()
    store = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the store never answered"
                time.sleep(0.05)
        os.kill(store.pid, signal.SIGSTOP)
        yield f"http://127.0.0.1:{port}/output.png"
    finally:
        os.kill(store.pid, signal.SIGCONT)
        store.kill()
        store.wait()


async def test_an_upload_to_a_frozen_store_is_unavailable_by_its_deadline(
    frozen_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 48 MiB at 96 MiB/s: half a second beyond the 1 s read timeout.
    monkeypatch.setattr(object_transfer, "SLOWEST_UPLOAD_BYTES_PER_SECOND", 96 << 20)
    transfer = ObjectTransfer(timeout_seconds=1.0)
    upload = OutputUpload(
        asset_id="a", url=frozen_store, method="PUT", headers={}, expires_at=datetime.now(UTC)
    )
    started = time.monotonic()
    try:
        with pytest.raises(MediaUnavailable):
            # The test's own bound: an upload that waits for ever fails here, not hangs.
            await asyncio.wait_for(transfer.upload(upload, OUTPUT), 10)
    finally:
        await transfer.close()
    assert time.monotonic() - started < 10
