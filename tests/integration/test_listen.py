"""The kit's LISTEN helper on real PostgreSQL: a NOTIFY wakes the owner, a lost
connection comes back by itself (and wakes the owner, who may have missed something)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from services.dev.postgres import connect_kwargs
from services.kit.listen import Listener


async def _backend_of(admin: asyncpg.Connection, channel: str) -> int | None:
    # By the listener's application name: its last query is LISTEN only until its first
    # check (SELECT 1), so the query text can't find it on a slow machine.
    pid = await admin.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
        channel,
    )
    return int(pid) if pid is not None else None


def _named(database_url: str, name: str) -> str:
    """The URL whose connections carry ``name`` as their application name."""
    return f"{database_url}{'&' if '?' in database_url else '?'}application_name={name}"


async def _until(condition: object, within: float = 10.0) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_notify_wakes_and_a_lost_connection_is_restored(database_url: str) -> None:
    channel = f"test_listen_{uuid.uuid4().hex[:8]}"
    payloads: list[str] = []
    listener = Listener(
        _named(database_url, channel), channel, on_notify=payloads.append, check_seconds=0.5
    )
    runner = asyncio.create_task(listener.run())
    admin = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        await asyncio.wait_for(listener.connected.wait(), 10)
        assert await listener.woken(0)  # a fresh connection wakes the owner once
        assert not await listener.woken(0.05)

        await admin.execute(f"NOTIFY {channel}, 'first'")
        assert await listener.woken(5)
        assert payloads == ["first"]

        async def listening_backend() -> bool:
            return await _backend_of(admin, channel) is not None

        await _until(listening_backend)
        old = await _backend_of(admin, channel)
        await admin.execute("SELECT pg_terminate_backend($1)", old)

        async def reconnected() -> bool:
            pid = await _backend_of(admin, channel)
            return pid is not None and pid != old and listener.connected.is_set()

        await _until(reconnected)
        assert await listener.woken(5)  # the reconnect itself wakes the owner
        await admin.execute(f"NOTIFY {channel}, 'second'")
        assert await listener.woken(5)
        assert payloads[-1] == "second"
    finally:
        await admin.close()
        await listener.stop(asyncio.get_running_loop().time() + 5)
        await asyncio.wait_for(runner, 5)
