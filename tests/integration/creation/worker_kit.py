"""What the worker tests share: a provider written for the test (a fake of the
third-party edge, scripted per test), a real media service, the worker on real
PostgreSQL, and conditions awaited with deadlines."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from PIL import Image
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job
from services.creation.media_client import MediaClient
from services.creation.providers.base import (
    Done,
    GenerationRequest,
    OutputImage,
    PollResult,
    Provider,
    Running,
)
from services.creation.settings import CreationSettings
from services.creation.store import jobs as store
from services.creation.store.rows import job_from_row
from services.creation.tables import jobs
from services.creation.worker.loop import Worker
from services.creation.worker.reaper import Reaper
from services.dev.processes import free_port
from services.kit.clock import system_clock
from services.kit.settings import DEV_SERVICE_TOKEN
from services.media.tables import assets
from tests.integration.creation.helpers import LIMITS, command, new_user
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media

# Short enough for tests, inside the settings' bounds (a lease lasts at least 5 s).
HEARTBEAT = 0.5
ENGINE_ENV = {
    "ATELIER_LEASE_TTL": "5",
    "ATELIER_HEARTBEAT": str(HEARTBEAT),
    "ATELIER_BACKOFF_BASE": "0.1",
    "ATELIER_BACKOFF_MAX": "1",
    "ATELIER_WORKER_POLL": "0.1",
    "ATELIER_WORKER_PROVIDER_POLL": "0.02",
    "ATELIER_WORKER_CONCURRENCY": "4",
    "ATELIER_WORKER_DRAIN": "5",
}


def output_png(width: int = 64, height: int = 48) -> OutputImage:
    image = Image.new("RGB", (width, height), (200, 30, 90))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return OutputImage(buffer.getvalue(), "image/png", width, height)


Step = Callable[[str], Awaitable[PollResult]]


@dataclass
class FakeProvider:
    """A provider whose answers the test scripts: ``on_submit`` decides a submit (returns
    a request id or raises), ``on_poll`` each poll. It records every call."""

    code: str = "stub"
    version: str = "test-1"
    supports_idempotent_submit: bool = False
    submits: list[tuple[str, str]] = field(default_factory=list)  # (job_id, key)
    polls: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    requests: list[GenerationRequest] = field(default_factory=list)
    on_submit: Callable[[GenerationRequest, str], Awaitable[str]] | None = None
    on_poll: Step | None = None

    async def submit(self, request: GenerationRequest, idempotency_key: str) -> str:
        self.submits.append((request.job_id, idempotency_key))
        self.requests.append(request)
        if self.on_submit is not None:
            return await self.on_submit(request, idempotency_key)
        return f"req-{idempotency_key}"

    async def poll(self, request_id: str) -> PollResult:
        self.polls.append(request_id)
        if self.on_poll is not None:
            return await self.on_poll(request_id)
        return Done([output_png()])

    async def cancel(self, request_id: str) -> None:
        self.cancels.append(request_id)

    async def close(self) -> None:
        return None


def running_until(event: asyncio.Event, progress: int = 50) -> Step:
    """A poll step: Running until ``event``, then Done."""

    async def step(request_id: str) -> PollResult:
        if event.is_set():
            return Done([output_png()])
        return Running(progress)

    return step


def engine_settings(database_url: str, media_address: str, **extra: str) -> CreationSettings:
    return CreationSettings.from_env(
        {
            "ATELIER_DATABASE_URL": database_url,
            "ATELIER_MEDIA_INTERNAL_ADDRESS": media_address,
            "ATELIER_NOTIFY_INTERNAL_ADDRESS": f"127.0.0.1:{free_port()}",  # nothing listens
            **ENGINE_ENV,
            **{f"ATELIER_{k}": v for k, v in extra.items()},
        }
    )


@dataclass
class Engine:
    """creation's engine on its own database, with real media beside it."""

    db: AsyncEngine
    url: str
    media: MediaHarness
    media_client: MediaClient
    provider: FakeProvider

    @property
    def media_address(self) -> str:
        return f"127.0.0.1:{self.media.running.internal_port}"

    def settings(self, **extra: str) -> CreationSettings:
        return engine_settings(self.url, self.media_address, **extra)

    def worker(self, on_point: Callable[[str], None] | None = None, **extra: str) -> Worker:
        providers: dict[str, Provider] = {"stub": self.provider}
        if on_point is None:
            return Worker(self.db, self.media_client, providers, self.settings(**extra))
        return Worker(
            self.db, self.media_client, providers, self.settings(**extra), on_point=on_point
        )

    def reaper(self, clock: Callable[[], Any] = system_clock) -> Reaper:
        return Reaper(self.db, {"stub": self.provider}, 60, clock=clock, media=self.media_client)

    async def input_asset(self, user: str) -> str:
        return await self.media_client.put_asset(user, "ai_input", "image/png", image_bytes("PNG"))

    async def submit(
        self, max_attempts: int = 3, user: str | None = None, num_outputs: int = 1
    ) -> Job:
        user = user or new_user()
        asset = await self.input_asset(user)
        limits = replace(LIMITS, max_attempts=max_attempts)
        built = command(input_asset_id=asset, num_outputs=num_outputs)
        submitted = await store.submit(self.db, user, built, limits, system_clock())
        return submitted.job

    async def outputs(self, user: str) -> dict[str, str]:
        """The user's ai_output assets in media: id -> status."""
        async with self.media.engine.connect() as connection:
            rows = (
                await connection.execute(
                    select(assets.c.asset_id, assets.c.status).where(
                        assets.c.owner_user_id == user, assets.c.purpose == "ai_output"
                    )
                )
            ).all()
        return {str(r.asset_id): r.status for r in rows}

    async def job(self, job_id: str) -> Job:
        async with self.db.connect() as connection:
            row = (await connection.execute(select(jobs).where(jobs.c.job_id == job_id))).one()
        return job_from_row(row._mapping)

    async def until_job(
        self, job_id: str, holds: Callable[[Job], bool], seconds: float = 15.0
    ) -> Job:
        """The job once ``holds`` is true of it; fails after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            job = await self.job(job_id)
            if holds(job):
                return job
            assert time.monotonic() < deadline, f"job never got there; it is {job}"
            await asyncio.sleep(0.02)


async def until(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(worker: Worker | Reaper, drain_seconds: float = 5.0) -> AsyncIterator[None]:
    task = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        loop = asyncio.get_running_loop()
        await worker.stop(loop.time() + drain_seconds)
        await asyncio.wait_for(task, drain_seconds + 5)


@asynccontextmanager
async def worker_stack(
    db: AsyncEngine, creation_url: str, media_url: str, work: Path
) -> AsyncIterator[Engine]:
    async with running_media(media_settings(media_url, work)) as media:
        client = MediaClient(f"127.0.0.1:{media.running.internal_port}", DEV_SERVICE_TOKEN)
        try:
            yield Engine(db, creation_url, media, client, FakeProvider())
        finally:
            await client.close()
