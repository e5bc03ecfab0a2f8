"""notify's store turns a database that does not answer into its own DatabaseFailed,
which answers as the kit's outages do (UNAVAILABLE DATABASE_UNAVAILABLE, or ABORTED
LOCK_TIMEOUT for a lock wait), each with a retry hint; any other failure passes as it
was raised."""

from __future__ import annotations

import socket

import grpc
import pytest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import create_engine
from services.kit.settings import DatabaseSettings
from services.notify.errors import DatabaseFailed
from services.notify.store import ProjectionStore, TokenStore
from services.notify.store.projection import hold_applies
from tests.support.notify import job_state, new_job_id


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_database_that_refuses_connections_is_unavailable() -> None:
    engine = create_engine(f"postgresql://atelier@127.0.0.1:{_closed_port()}/notify")
    try:
        with pytest.raises(DatabaseFailed) as raised:
            await TokenStore(engine).list_devices("alice", 10, None)
    finally:
        await engine.dispose()
    answer = raised.value.to_api_error()
    assert (answer.code, answer.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
    assert answer.retry_after_seconds is not None
    assert answer.metadata == {"dependency": "database"}


async def test_a_lock_wait_past_lock_timeout_is_contention(
    engine: AsyncEngine, notify_url: str
) -> None:
    impatient = create_engine(notify_url, limits=DatabaseSettings(lock_timeout_seconds=0.1))
    try:
        async with engine.begin() as holder:
            await hold_applies(holder)
            with pytest.raises(DatabaseFailed) as raised:
                await ProjectionStore(impatient).apply([job_state(new_job_id(), 1)])
    finally:
        await impatient.dispose()
    answer = raised.value.to_api_error()
    assert (answer.code, answer.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")
    assert answer.retry_after_seconds is not None


async def test_a_failure_that_is_not_an_outage_passes_unchanged(engine: AsyncEngine) -> None:
    with pytest.raises(DBAPIError):
        await ProjectionStore(engine).latest(["not a job id"])
