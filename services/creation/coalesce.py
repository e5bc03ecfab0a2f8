"""Calls asked for in one turn of the event loop, answered by one batched call.

The worker starts a claimed batch's attempts together, so their calls for the same kind
of answer (an input's signed URL, an output's reservation or commit) arrive within one
loop turn: one call for all of them costs media one request's overhead, not one per job.
The batch call answers each key with its value or its own error. A key it leaves out, or
a batch call that fails in a way the single call words better (an older media that has
no batched call, say), is asked for alone, so each caller still gets its own answer or
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# What a batch call raises that every caller of the batch should see as it is (media
# unavailable); anything else sends each key to the single call.
Shared = tuple[type[BaseException], ...]


class Coalescer(Generic[K, V]):
    def __init__(
        self,
        many: Callable[[Sequence[K]], Awaitable[Mapping[K, V | Exception]]],
        one: Callable[[K], Awaitable[V]],
        max_batch: int,
        shared: Shared = (),
    ) -> None:
        self._many = many
        self._one = one
        self._max_batch = max_batch
        self._shared = shared
        self._waiting: dict[K, list[asyncio.Future[V]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, key: K) -> V:
        loop = asyncio.get_running_loop()
        if not self._waiting:
            # The batch is sent once every caller of this turn has asked.
            loop.call_soon(self._send)
        future: asyncio.Future[V] = loop.create_future()
        self._waiting.setdefault(key, []).append(future)
        if len(self._waiting) >= self._max_batch:
            self._send()
        # A cancelled caller cancels only its own wait, never the batch's call.
        return await future

    def _send(self) -> None:
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, {}
        task = asyncio.get_running_loop().create_task(self._answer(waiting))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, waiting: dict[K, list[asyncio.Future[V]]]) -> None:
        keys = list(waiting)
        try:
            found = await self._many(keys)
        except self._shared as error:
            for futures in waiting.values():
                _fail(futures, error)
            return
        except asyncio.CancelledError:
            # This task's own cancellation (the loop closing): no caller waits forever.
            for futures in waiting.values():
                _cancel(futures)
            raise
        except Exception:
            found = {}
        alone = [key for key in keys if key not in found]
        for key in keys:
            if key not in found:
                continue
            answer = found[key]
            if isinstance(answer, Exception):
                _fail(waiting[key], answer)
            else:
                _resolve(waiting[key], answer)
        await asyncio.gather(*(self._answer_alone(key, waiting[key]) for key in alone))

    async def _answer_alone(self, key: K, futures: list[asyncio.Future[V]]) -> None:
        try:
            value = await self._one(key)
        except asyncio.CancelledError:
            _cancel(futures)
            raise
        except Exception as error:
            _fail(futures, error)
            return
        _resolve(futures, value)


def _resolve(futures: list[asyncio.Future[V]], value: V) -> None:
    for future in futures:
        if not future.done():  # done: its caller was cancelled
            future.set_result(value)


def _fail(futures: list[asyncio.Future[V]], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)


def _cancel(futures: list[asyncio.Future[V]]) -> None:
    for future in futures:
        future.cancel()
