"""The event loop a process runs its coroutine on.

uvloop unless ``ATELIER_EVENT_LOOP=asyncio``: a libuv loop makes each wake-up, socket
read and write cheaper, and a gRPC call or a database round trip is mostly those
(bench/submit_throughput.py: ~20 % less creation CPU per submit, ~10 % per read;
docs/benchmarks.md, 2026-12-01). The standard loop stays one setting away, should a
library ever misbehave on uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("uvloop", "asyncio")
DEFAULT_EVENT_LOOP = "uvloop"


def run(main: Coroutine[Any, Any, T], event_loop: str = DEFAULT_EVENT_LOOP) -> T:
    """``asyncio.run(main)`` on the named loop."""
    if event_loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    if event_loop == "asyncio":
        return asyncio.run(main)
    main.close()
    raise ValueError(f"unknown event loop {event_loop!r} (one of {', '.join(EVENT_LOOPS)})")


def running_loop_name() -> str:
    """Which kind of loop runs the calling coroutine (for the start-up log line)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"
