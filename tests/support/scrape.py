"""Reads a service's real /metrics endpoint over HTTP, as Prometheus would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    """One scrape's samples: (name, sorted labels) -> value."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def get(self, name: str, **labels: str) -> float:
        found = self.value(name, **labels)
        assert found is not None, f"{name}{labels} is not exported"
        return found


async def scrape(port: int) -> Scrape:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(samples)


async def scrape_until(port: int, holds: Callable[[Scrape], bool], seconds: float = 10.0) -> Scrape:
    """Scrapes until ``holds`` is true of a scrape (for figures a background task sets as
    it goes); fails after ``seconds`` with the last scrape's samples."""
    deadline = time.monotonic() + seconds
    while True:
        got = await scrape(port)
        if holds(got):
            return got
        assert time.monotonic() < deadline, "the metrics never got there"
        await asyncio.sleep(0.05)
