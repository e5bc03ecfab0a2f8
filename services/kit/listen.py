"""LISTEN/NOTIFY for background components (the outbox relay, the worker): a dedicated
asyncpg connection that LISTENs on one channel and wakes its owner.

A notification is only a hint that there is work; the owner still polls as a fallback,
because notifications sent while the connection was down are lost. So every (re)connect
also wakes the owner, and the connection is checked now and then: a server that froze or
vanished behind a dead network path never closes it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from services.kit.logging import get_logger
from services.kit.outages import Throttle

log = get_logger(__name__)


def asyncpg_dsn(url: str) -> str:
    """The DSN asyncpg itself takes, from any of our PostgreSQL URL spellings."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    """A component: ``run()`` until ``stop()``. ``woken()`` returns when a notification
    arrived (or the connection came back) or the poll period ran out."""

    def __init__(
        self,
        url: str,
        channel: str,
        *,
        on_notify: Callable[[str], None] | None = None,
        connect_timeout_seconds: float = 2.0,
        check_seconds: float = 10.0,
        backoff_max_seconds: float = 5.0,
    ) -> None:
        self.name = f"listen:{channel}"
        self._dsn = asyncpg_dsn(url)
        self._channel = channel
        self._on_notify = on_notify
        self._connect_timeout = connect_timeout_seconds
        self._check_seconds = check_seconds
        self._backoff_max = backoff_max_seconds
        self._woken = asyncio.Event()
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self._log = Throttle()

    async def woken(self, poll_seconds: float) -> bool:
        """True when woken (a notification, or a reconnect that may have missed some);
        False when ``poll_seconds`` passed first. Either way the owner should look for
        work."""
        if not self._woken.is_set():
            try:
                await asyncio.wait_for(self._woken.wait(), poll_seconds)
            except TimeoutError:
                return False
        self._woken.clear()
        return True

    def _notified(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        self._woken.set()
        if self._on_notify is not None:
            self._on_notify(payload)

    async def run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                await self._listen_once()
                delay = 0.1
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                self.connected.clear()
                kind = type(error).__name__
                if self._log.admit(kind) is not None:
                    log.warning("listen_connection_lost", channel=self._channel, error=kind)
            if self._stopping.is_set():
                return
            # Full jitter: many replicas must not reconnect in step after an outage.
            await self._sleep(random.uniform(0, delay))  # noqa: S311 - jitter, not a secret
            delay = min(self._backoff_max, delay * 2)

    async def _listen_once(self) -> None:
        connection = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _: lost.set())
        try:
            await connection.add_listener(self._channel, self._notified)
            self.connected.set()
            self._woken.set()  # anything sent while we were away is the owner's to find
            log.info("listening", channel=self._channel)
            while not (lost.is_set() or self._stopping.is_set()):
                await self._sleep(self._check_seconds, lost)
                if not (lost.is_set() or self._stopping.is_set()):
                    await connection.fetchval("SELECT 1", timeout=self._connect_timeout)
        finally:
            self.connected.clear()
            if not connection.is_closed():
                connection.terminate()  # never wait on a server that may not answer
        if lost.is_set() and not self._stopping.is_set():
            raise ConnectionResetError("listen connection closed")

    async def _sleep(self, seconds: float, *also: asyncio.Event) -> None:
        waiters = [asyncio.create_task(e.wait()) for e in (self._stopping, *also)]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def stop(self, deadline: float) -> None:
        self._stopping.set()
