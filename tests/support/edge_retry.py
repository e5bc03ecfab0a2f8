"""Requests sent again as docs/edge.md tells a client to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx


async def as_a_client_would(
    send: Callable[[], Awaitable[httpx.Response]], attempts: int = 5
) -> httpx.Response:
    """The answer to a request sent again while it is a 409 or 503 with `retry-after` (a
    loaded machine can leave the database that slow); anything else at once. Only for
    requests that are safe to repeat (cancel, delete, the device and Live Activity
    registrations, which are upserts)."""
    for _ in range(attempts - 1):
        answer = await send()
        if answer.status_code not in (409, 503) or "retry-after" not in answer.headers:
            return answer
        await asyncio.sleep(float(answer.headers["retry-after"]))
    return await send()
