"""An output whose bytes were PUT to their signed URL but never committed (the worker
killed with SIGKILL between its PUT and its commit) and that no worker resumes is swept
by media's housekeeping once its reservation expires: the object is removed from the
store and the asset's row marked deleted, so nothing is left orphaned. (A worker that
resumes the attempt in time commits the object instead: tests/support/crash_matrix.py,
point after_upload.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.support.crash_matrix import submit
from tests.support.stacks import stack_of_its_own
from tests.support.workers import exited, start_worker

# The shortest reservation media allows, swept every half second.
UPLOAD_TTL_SECONDS = 10
MEDIA_ENV = {
    "ATELIER_ENV": "test",
    "ATELIER_MEDIA_UPLOAD_URL_TTL": str(UPLOAD_TTL_SECONDS),
    "ATELIER_MEDIA_HOUSEKEEPING_PERIOD": "0.5",
}
WORKER_ENV = {
    "ATELIER_STUB_DURATION": "0",
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": "1",
    "ATELIER_WORKER_PROVIDER_POLL": "0.2",
    "ATELIER_WORKER_POLL": "0.5",
}


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("uncommitted")
    with stack_of_its_own(postgres_admin_url, work, "api", MEDIA_ENV) as stack:
        yield stack


async def outputs_of(api: Stack, owner: str) -> list[tuple[str, str]]:
    """(status, object key) of each of ``owner``'s ai_output assets, deleted ones too."""
    engine = create_async_engine(asyncpg_url(api.database_url))
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT status, object_key FROM media.assets"
                    " WHERE owner_user_id = :o AND purpose = 'ai_output'"
                ),
                {"o": owner},
            )
            return [(row.status, row.object_key) for row in rows]
    finally:
        await engine.dispose()


async def test_an_output_put_but_never_committed_is_swept_by_housekeeping(
    api: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    user, _ = await submit(api, http)
    env = {
        **WORKER_ENV,
        "ATELIER_STUB_LEDGER": str(tmp_path / "ledger"),
        "ATELIER_STUB_CRASH_AT": "after_upload",
    }
    doomed = start_worker(api, "crash-after-upload", env)
    assert await exited(doomed, within=30) == -9  # SIGKILL, between the PUT and the commit

    # The first output's bytes are in the store, its asset still uploading.
    [(status, key)] = await outputs_of(api, user.user_id)
    stored = api.work_dir / "media" / key
    assert status == "uploading" and stored.is_file()

    deadline = time.monotonic() + UPLOAD_TTL_SECONDS + 20
    while (await outputs_of(api, user.user_id))[0][0] != "deleted":
        assert time.monotonic() < deadline, "housekeeping never swept the upload"
        await asyncio.sleep(0.2)
    assert not stored.exists()
