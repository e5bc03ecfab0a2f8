"""The object listener's reads of asset states, shared: lookups that arrive while earlier
ones are being answered are answered together, by one statement, not one each.

A worker PUTs a claimed batch's outputs at once and its attempts GET their inputs at
once, so the listener asks for many keys' states within a few milliseconds; each lookup
alone is a pool checkout and a round trip. Here at most ``in_flight`` statements run at
a time, and every lookup that arrives meanwhile waits for the next one, which takes all
of them (each key once, however many requests ask for it).

A lookup is never answered from a statement sent before it was asked for: a batch is
taken from the waiting lookups just before its statement goes out, so its answer is at
least as new as each of its requests. An asset deleted before a request arrived is seen
deleted by it, exactly as with a statement of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from services.media.domain import Status

# Statements at once; more lookups wait for the next.
IN_FLIGHT = 2
# Keys one statement names at most (a batch past it is split).
MAX_KEYS = 500


class ManyKeyStatuses(Protocol):
    async def statuses_by_key(self, object_keys: Sequence[str]) -> dict[str, Status]: ...


class KeyStatuses:
    """``status_by_key`` as the listener asks it (the asset's status; None: no asset has
    the key), batched. A failure of the statement (the database down) is raised to every
    lookup of its batch."""

    def __init__(
        self, rows: ManyKeyStatuses, in_flight: int = IN_FLIGHT, max_keys: int = MAX_KEYS
    ) -> None:
        self._rows = rows
        self._slots = asyncio.Semaphore(in_flight)
        self._max_keys = max_keys
        self._waiting: dict[str, list[asyncio.Future[Status | None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def status_by_key(self, object_key: str) -> Status | None:
        loop = asyncio.get_running_loop()
        if not self._waiting:
            # One batch is sent for everything that waits by the time a slot is free.
            task = loop.create_task(self._answer_next())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        future: asyncio.Future[Status | None] = loop.create_future()
        self._waiting.setdefault(object_key, []).append(future)
        # A cancelled request cancels only its own wait, never the batch's statement.
        return await future

    async def _answer_next(self) -> None:
        async with self._slots:
            waiting = self._take()
            if not waiting:
                return  # an earlier batch took them
            try:
                found = await self._rows.statuses_by_key(list(waiting))
            except BaseException as error:
                for futures in waiting.values():
                    for future in futures:
                        if not future.done():
                            _fail(future, error)
                if not isinstance(error, Exception):
                    raise
                return
        for key, futures in waiting.items():
            status = found.get(key)
            for future in futures:
                if not future.done():  # done: its request was cancelled
                    future.set_result(status)

    def _take(self) -> dict[str, list[asyncio.Future[Status | None]]]:
        """The waiting lookups, at most ``max_keys`` keys (the rest get a batch of their
        own)."""
        if len(self._waiting) <= self._max_keys:
            waiting, self._waiting = self._waiting, {}
            return waiting
        keys = list(self._waiting)[: self._max_keys]
        waiting = {key: self._waiting.pop(key) for key in keys}
        task = asyncio.get_running_loop().create_task(self._answer_next())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return waiting


def _fail(future: asyncio.Future[Status | None], error: BaseException) -> None:
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)
