"""notify for tests: the real service in this process on real listeners over a database
of its own, with a publisher that records what each Deliver moved."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc

from atelier.creation.v1 import job_pb2
from services.kit.server import RunningService
from services.kit.settings import ListenSettings
from services.notify.app import build
from services.notify.projection import AppliedState
from services.notify.settings import NotifySettings


@dataclass
class RecordingPublisher:
    """Keeps every announced change, in order; ``pause`` makes each publish take that
    long (a slow fan-out holds the Deliver call open)."""

    published: list[AppliedState] = field(default_factory=list)
    pause: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish(self, applied: Sequence[AppliedState]) -> None:
        if self.pause:
            await asyncio.sleep(self.pause)
        self.published.extend(applied)
        self.changed.set()

    def versions(self) -> dict[str, list[int]]:
        """Each job's announced versions, in the order they were announced."""
        seen: dict[str, list[int]] = {}
        for applied in self.published:
            seen.setdefault(applied.job_id, []).append(applied.version)
        return seen


@dataclass
class NotifyHarness:
    running: RunningService
    publisher: RecordingPublisher

    @property
    def internal_address(self) -> str:
        return f"127.0.0.1:{self.running.internal_port}"

    def internal_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.internal_address)

    def public_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.running.public_port}")


def notify_settings(database_url: str, **environ: str) -> NotifySettings:
    """``environ``: more ATELIER_* settings (names without the prefix)."""
    return NotifySettings.from_env(
        {
            "ATELIER_DATABASE_URL": database_url,
            "ATELIER_DRAIN_GRACE": "0",
            **{f"ATELIER_{name}": value for name, value in environ.items()},
        }
    )


@asynccontextmanager
async def running_notify(
    database_url: str,
    publisher: RecordingPublisher | None = None,
    internal_port: int = 0,
    **environ: str,
) -> AsyncIterator[NotifyHarness]:
    """notify on free ports (or the internal port given: a test that brings notify back
    where a relay already looks for it); ``environ``: more settings, as notify_settings."""
    publisher = publisher or RecordingPublisher()
    settings = notify_settings(database_url, **environ)
    running = RunningService(
        build(settings, publisher), settings.common, ListenSettings(0, internal_port, 0)
    )
    await running.start()
    try:
        yield NotifyHarness(running, publisher)
    finally:
        await running.stop()


def job_state(
    job_id: str,
    version: int,
    *,
    user_id: str = "user-1",
    status: job_pb2.JobStatus.ValueType = job_pb2.JOB_STATUS_RUNNING,
    progress: int = 0,
    step: job_pb2.JobStep.ValueType = job_pb2.JOB_STEP_UNSPECIFIED,
) -> job_pb2.Job:
    return job_pb2.Job(
        job_id=job_id,
        user_id=user_id,
        version=version,
        status=status,
        progress_percent=progress,
        step=step,
        done=status
        in (job_pb2.JOB_STATUS_SUCCEEDED, job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELLED),
    )


def new_job_id() -> str:
    return str(uuid.uuid4())
