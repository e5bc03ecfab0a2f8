"""Batched RPCs answered item by item: each item gets what its single call would have
answered, its result or its own ``google.rpc.Status``, so one refusal never fails the
rest of a batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from google.rpc import status_pb2

from services.kit.errors import FieldViolation, invalid_argument
from services.kit.interceptors import api_error_of
from services.kit.outages import Throttle

Item = TypeVar("Item")
Result = TypeVar("Result")

# A batch of failing items (a database outage) must not log a line per item.
_throttle = Throttle()


def batch_size(count: int, field: str, maximum: int, reason: str) -> None:
    """A batch holds 1 to ``maximum`` items; else INVALID_ARGUMENT ``reason`` on ``field``."""
    if not 1 <= count <= maximum:
        raise invalid_argument(
            reason, [FieldViolation(field, f"must hold 1 to {maximum} items, not {count}")]
        )


async def answer_each(
    items: Sequence[Item], answer: Callable[[Item], Awaitable[Result]], method: str
) -> list[Result | status_pb2.Status]:
    """``answer`` of every item, concurrently, in the items' order; an item whose answer
    raised gets the status the server stack maps that exception to. A cancellation (the
    call's deadline, the caller gone) ends the whole call."""

    async def one(item: Item) -> Result | status_pb2.Status:
        try:
            return await answer(item)
        except Exception as error:
            return api_error_of(error, method, _throttle).to_status()

    return list(await asyncio.gather(*(one(item) for item in items)))
