"""notify replicas in the test's own event loop, a Redis the test controls, and stream
readers: what the stream tests share."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import redis

from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.dev.processes import free_port
from services.kit.auth import issue_token
from services.kit.server import RunningService
from services.kit.settings import CommonSettings, EnvReader, ListenSettings
from services.notify.app import Streams, assemble
from services.notify.settings import NotifySettings, StreamSettings

REDIS_SERVER = "/usr/bin/redis-server"


class OwnRedis:
    """A redis-server of the test's own on a fixed port, to stop and start again (never
    the machine's shared one)."""

    def __init__(self, work: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._work = work
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._work),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def subscribers(self, channel: str) -> int:
        client = redis.Redis(port=self.port)
        return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def settings(
    database_url: str,
    redis_url: str = "",
    poll_period: float = 2.0,
    **streams: Any,
) -> NotifySettings:
    common = CommonSettings.read(
        EnvReader({"ATELIER_DATABASE_URL": database_url, "ATELIER_DRAIN_GRACE": "2"})
    )
    return NotifySettings(
        common=common,
        listen=ListenSettings(0, 0, 0),
        redis_url=redis_url,
        poll_period_seconds=poll_period,
        streams=replace(StreamSettings(), **streams),
        # No creation to place queued jobs: a port where nothing listens, never a default
        # one some stack may hold.
        creation_internal_address=f"127.0.0.1:{free_port()}",
    )


@dataclass
class Replica:
    running: RunningService
    streams: Streams
    channel: grpc.aio.Channel
    stub: notify_service_pb2_grpc.NotifyServiceStub
    settings: NotifySettings

    def token(self, user_id: str) -> tuple[tuple[str, str], ...]:
        common = self.settings.common
        token = issue_token(common.jwt_secret, common.jwt_issuer, common.jwt_audience, user_id, 600)
        return (("authorization", f"Bearer {token}"),)


@asynccontextmanager
async def replica(notify_settings: NotifySettings) -> AsyncIterator[Replica]:
    app, streams = assemble(notify_settings)
    running = RunningService(app, notify_settings.common, notify_settings.listen)
    await running.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}")
    try:
        yield Replica(
            running,
            streams,
            channel,
            notify_service_pb2_grpc.NotifyServiceStub(channel),
            notify_settings,
        )
    finally:
        await channel.close(grace=None)
        await running.stop()


class Reader:
    """Reads a stream in the background; tests await the next message of a kind."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.messages: asyncio.Queue[Any] = asyncio.Queue()
        self.done = asyncio.Event()
        self.error: grpc.aio.AioRpcError | None = None
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.call:
                await self.messages.put(message)
        except grpc.aio.AioRpcError as error:
            self.error = error
        finally:
            self.done.set()

    async def next(self, kind: str | None = None, within: float = 5.0) -> Any:
        """The next message (skipping keep-alives unless asked for one)."""
        async with asyncio.timeout(within):
            while True:
                message = await self.messages.get()
                which = message.WhichOneof("event")
                if kind is None and which == "keep_alive":
                    continue
                if kind is None or which == kind:
                    return message

    def pending(self) -> list[Any]:
        items = []
        while not self.messages.empty():
            items.append(self.messages.get_nowait())
        return items

    def cancel(self) -> None:
        self.call.cancel()


def watch_job(rep: Replica, user: str, job_id: str, after_version: int = 0) -> Reader:
    return Reader(
        rep.stub.WatchJob(
            pb.WatchJobRequest(job_id=job_id, after_version=after_version),
            metadata=rep.token(user),
        )
    )


def watch_jobs(rep: Replica, user: str, cursor: str = "") -> Reader:
    return Reader(rep.stub.WatchJobs(pb.WatchJobsRequest(cursor=cursor), metadata=rep.token(user)))
