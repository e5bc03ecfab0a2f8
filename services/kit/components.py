"""Background components (worker loops, relays, housekeeping) and their supervision.

A component runs until asked to stop, then finishes what it holds within a deadline: a
worker completes or hands back its leases while its own heartbeats keep running. If a
component ends on its own, or raises, the process must stop rather than limp on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from services.kit.logging import get_logger

log = get_logger(__name__)


class Component(Protocol):
    name: str

    async def run(self) -> None:
        """Works until :meth:`stop`; returning or raising earlier is a failure."""

    async def stop(self, deadline: float) -> None:
        """Asks the component to finish by ``deadline`` (the event loop's clock); ``run``
        returns once it has. It must not wait past the deadline."""


class TaskComponent:
    """A loop that may simply be cancelled between any two awaits (its work is safe to
    interrupt, e.g. a sweep whose transaction rolls back), as a component."""

    def __init__(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def run(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self.name)
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._stopping:
                raise

    async def stop(self, deadline: float) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()


class ComponentFailed(Exception):
    """A component ended or raised before it was asked to stop."""


class Supervisor:
    """Runs components, notices the first one that dies, and stops them all in order."""

    def __init__(self, components: Sequence[Component]) -> None:
        self._components = list(components)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        # Set when a component dies: the process must stop rather than limp on.
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    def start(self) -> None:
        for component in self._components:
            self._tasks[component.name] = asyncio.create_task(
                self._watch(component), name=f"component:{component.name}"
            )

    async def _watch(self, component: Component) -> None:
        try:
            await component.run()
        except asyncio.CancelledError:
            if not self._stopping:
                self._fail(component, ComponentFailed(f"{component.name} was cancelled"))
            raise
        except Exception as error:
            log.exception("component_died", component=component.name)
            self._fail(component, error)
            return
        if not self._stopping:
            log.error("component_ended", component=component.name)
            self._fail(component, ComponentFailed(f"{component.name} ended on its own"))

    def _fail(self, component: Component, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.failed.set()

    async def stop(self, seconds: float) -> None:
        """Asks every component to stop within ``seconds``, all at once; any still running
        at the deadline is cancelled."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        running = [c for c in self._components if not self._tasks[c.name].done()]
        await asyncio.gather(*(self._ask(c, deadline) for c in running), return_exceptions=True)
        tasks = [self._tasks[c.name] for c in running]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
            for task in late:
                log.warning("component_stop_overdue", component=task.get_name())
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        log.info("components_stopped", count=len(self._components))

    async def _ask(self, component: Component, deadline: float) -> None:
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait_for(component.stop(deadline), remaining)
        except Exception:
            log.exception("component_stop_failed", component=component.name)
