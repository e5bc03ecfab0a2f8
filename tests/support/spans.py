"""Spans recorded in the test process (the SDK's in-memory exporter), and waiting for one
by event rather than by sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.kit import tracing


class Spans:
    """Every span the process ends while installed, with a way to await one."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self._changed = asyncio.Event()
        self.provider.add_span_processor(_Notifier(self._changed))

    @property
    def finished(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name}: {self.finished}"
        return found[0]

    async def wait_for(
        self, condition: Callable[[], bool], within: float = 10.0, what: str = "spans"
    ) -> None:
        """Returns once ``condition`` holds, checked each time a span ends."""

        async def until() -> None:
            while not condition():
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(until(), within)
        except TimeoutError:
            names = [s.name for s in self.finished]
            raise AssertionError(f"{what} not there after {within} s; ended: {names}") from None


class _Notifier(SpanProcessor):
    def __init__(self, changed: asyncio.Event) -> None:
        self._event = changed

    def on_end(self, span: ReadableSpan) -> None:
        self._event.set()


@contextmanager
def recorded_spans() -> Iterator[Spans]:
    """Tracing on, into memory, for what is built inside the block."""
    spans = Spans()
    tracing.install(spans.provider)
    try:
        yield spans
    finally:
        tracing.install(None)
        spans.provider.shutdown()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id
