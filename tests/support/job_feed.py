"""notify replicas as real processes (killed and started again on the same ports) over one
database and one Redis, the credentials of the identities that call them, and a reader of
the job feed (WatchAllJobs) that remembers what it was sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import (
    notify_feed_service_pb2,
    notify_feed_service_pb2_grpc,
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
)
from services.dev.processes import Child, free_port, grpc_serving, spawn, wait_until
from services.kit.identities import WATCH_ALL_JOBS, entry

# Each identity's credential (raw: the settings hold their hashes).
CREATION = "feed-test-creation-credential-0123456789"
NOTIFY = "feed-test-notify-credential-0123456789ab"
READER = "feed-test-reader-credential-0123456789ab"
OTHER = "feed-test-other-backend-credential-012345"
IDENTITIES = [
    entry("creation", "creation", (CREATION,)),
    entry("notify", "notify", (NOTIFY,)),
    entry("feed-reader", "backend", (READER,), allow=(WATCH_ALL_JOBS,)),
    # A backend with another internal grant, but not the feed's.
    entry("other", "backend", (OTHER,), allow=("/atelier.notify.v1.NotifyIngestService/Deliver",)),
]


def bearer(credential: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"),)


@dataclass
class NotifyProcess:
    """One notify replica (``python -m services.notify``) on ports of its own."""

    name: str
    env: dict[str, str]
    log_dir: Path
    public: int = field(default_factory=free_port)
    internal: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)
    child: Child | None = None

    @property
    def internal_address(self) -> str:
        return f"127.0.0.1:{self.internal}"

    def start(self) -> None:
        env = {
            **self.env,
            "ATELIER_NOTIFY_PUBLIC_PORT": str(self.public),
            "ATELIER_NOTIFY_INTERNAL_PORT": str(self.internal),
            "ATELIER_NOTIFY_METRICS_PORT": str(self.metrics),
        }
        self.child = spawn(self.name, [sys.executable, "-m", "services.notify"], env, self.log_dir)
        wait_until(self.child, grpc_serving(self.internal_address), 60)

    def kill(self) -> None:
        """SIGKILL: no drain, no StreamEnd, as a node that dies."""
        assert self.child is not None
        self.child.process.send_signal(signal.SIGKILL)
        self.child.process.wait()

    def terminate(self) -> None:
        """SIGTERM: the replica drains (its streams get a StreamEnd) and exits."""
        assert self.child is not None
        self.child.process.send_signal(signal.SIGTERM)
        self.child.process.wait(30)

    def stop(self) -> None:
        if self.child is not None and self.child.alive():
            self.child.process.send_signal(signal.SIGTERM)
            try:
                self.child.process.wait(15)
            except Exception:
                self.child.process.kill()
                self.child.process.wait()


def notify_env(database_url: str, redis_url: str, **more: str) -> dict[str, str]:
    return {
        "ATELIER_ENV": "dev",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_REDIS_URL": redis_url,
        "ATELIER_DRAIN_GRACE": "2",
        "ATELIER_SERVICE_IDENTITIES": json.dumps(IDENTITIES),
        "ATELIER_SERVICE_CREDENTIAL": NOTIFY,
        # No media or creation: ports where nothing listens (URLs stay empty).
        "ATELIER_MEDIA_INTERNAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "ATELIER_CREATION_INTERNAL_ADDRESS": f"127.0.0.1:{free_port()}",
        **{f"ATELIER_{name}": value for name, value in more.items()},
    }


def job(
    job_id: str,
    user_id: str,
    version: int,
    status: job_pb2.JobStatus.ValueType,
    *,
    model_id: str = "stub-fast",
    deleted: bool = False,
) -> job_pb2.Job:
    return job_pb2.Job(
        job_id=job_id,
        user_id=user_id,
        model_id=model_id,
        version=version,
        status=status,
        deleted=deleted,
    )


async def deliver(address: str, states: Sequence[job_pb2.Job]) -> int:
    """creation's relay's call: the states to a replica's Deliver; how many moved."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(channel)
        reply = await stub.Deliver(
            notify_ingest_service_pb2.DeliverRequest(
                messages=[
                    notify_ingest_service_pb2.OutboxMessage(outbox_id=i + 1, job=s)
                    for i, s in enumerate(states)
                ]
            ),
            metadata=bearer(CREATION),
            timeout=20,
        )
    return int(reply.applied_count)


class FeedReader:
    """One WatchAllJobs stream read in the background: every job state it was sent (in
    order), the last cursor, and how it ended. ``reconnect`` opens a new stream from the
    last cursor (to the same address or another)."""

    def __init__(self, address: str, credential: str = READER, **request: Any) -> None:
        self.request = request
        self.credential = credential
        self.states: list[job_pb2.Job] = []
        self.cursor = ""
        self.snapshot_ends = 0
        # The StreamEnd messages received, and the final error message (a google.rpc.Status).
        self.ends: list[Any] = []
        self.error_messages: list[Any] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.ended = asyncio.Event()
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._open(address, request.get("cursor", ""))

    def _open(self, address: str, cursor: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        stub = notify_feed_service_pb2_grpc.NotifyFeedServiceStub(self._channel)
        request = notify_feed_service_pb2.WatchAllJobsRequest(
            cursor=cursor,
            user_ids=self.request.get("user_ids", ()),
            model_ids=self.request.get("model_ids", ()),
        )
        call = stub.WatchAllJobs(request, metadata=bearer(self.credential))
        self._call = call
        self.error = None
        self.ended.clear()
        self._task = asyncio.create_task(self._read(call))

    async def _read(self, call: Any) -> None:
        try:
            async for message in call:
                which = message.WhichOneof("event")
                if message.cursor:
                    self.cursor = message.cursor
                if which == "job":
                    self.states.append(message.job)
                elif which == "snapshot_end":
                    self.snapshot_ends += 1
                elif which == "end":
                    self.ends.append(message.end)
                elif which == "error":
                    self.error_messages.append(message.error)
                self._changed.set()
        except grpc.aio.AioRpcError as error:
            self.error = error
        finally:
            self.ended.set()
            self._changed.set()

    async def wait_for(self, check: Any, within: float = 30.0) -> None:
        """Until ``check(self)`` holds (re-checked after every message)."""
        async with asyncio.timeout(within):
            while not check(self):
                self._changed.clear()
                if check(self):
                    return
                await self._changed.wait()

    async def caught_up(self, count: int = 1, within: float = 30.0) -> None:
        await self.wait_for(lambda r: r.snapshot_ends >= count or r.ended.is_set(), within)
        assert self.error is None, self.error

    def latest(self) -> dict[str, int]:
        """The highest version received per job."""
        found: dict[str, int] = {}
        for state in self.states:
            found[state.job_id] = max(found.get(state.job_id, 0), state.version)
        return found

    def has(self, versions: dict[str, int]) -> bool:
        latest = self.latest()
        return all(latest.get(j, 0) >= v for j, v in versions.items())

    def versions_per_job(self) -> dict[str, list[int]]:
        per_job: dict[str, list[int]] = {}
        for state in self.states:
            per_job.setdefault(state.job_id, []).append(state.version)
        return per_job

    async def reconnect(self, address: str) -> None:
        await self.close()
        self._open(address, self.cursor)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self._call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task
        if self._channel is not None:
            await self._channel.close(grace=None)
