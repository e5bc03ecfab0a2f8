"""notify's streams through the real edge: JSON over HTTP with curl (one JSON object per
line), and many concurrent streams with none refused. A notify replica runs in the test's
loop behind Envoy; a stand-in for Deliver applies rows and publishes, as Deliver does."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.dev import edge
from services.dev.processes import free_port
from services.kit.db import asyncpg_url
from tests.support.databases import migrated_database
from tests.support.edges import running_edge
from tests.support.notify_streams import Replica, replica, settings
from tests.support.projection import apply, ensure_table, job_state

QUEUED = job_pb2.JOB_STATUS_QUEUED
RUNNING = job_pb2.JOB_STATUS_RUNNING
SUCCEEDED = job_pb2.JOB_STATUS_SUCCEEDED


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture(scope="module")
async def db(notify_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(notify_url))
    await ensure_table(engine)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="module")
async def rep(db: AsyncEngine, notify_url: str) -> AsyncIterator[Replica]:
    async with replica(settings(notify_url)) as running:
        yield running


@dataclass(frozen=True)
class Edge:
    url: str
    admin_port: int


@pytest.fixture(scope="module")
def edge_url(the_edge: Edge) -> str:
    return the_edge.url


@pytest.fixture(scope="module")
def the_edge(rep: Replica, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    work: Path = tmp_path_factory.mktemp("stream-edge")
    nowhere = free_port()
    config = edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports={
            "creation": nowhere,
            "media": nowhere,
            "media_http": nowhere,
            "notify": rep.running.public_port,
        },
    )
    with running_edge(config, work) as running:
        yield Edge(running.url, running.admin_port)


async def deliver(
    db: AsyncEngine, rep: Replica, job: str, user: str, version: int, status: int, progress: int = 0
) -> None:
    applied = await apply(db, [job_state(job, user, version, status, progress)])
    await rep.streams.publisher.publish(applied)


class Curl:
    """`curl -sN` reading a JSON stream, one object per line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def get(cls, url: str, token: str) -> Curl:
        process = await asyncio.create_subprocess_exec(
            "curl",
            "-sN",
            "-H",
            f"authorization: Bearer {token}",
            "-w",
            "\n%{http_code}\n",
            url,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def line(self, within: float = 5.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.process.stdout.readline(), within)
            assert raw, "the stream ended"
            if raw.strip():
                parsed: dict[str, Any] = json.loads(raw)
                return parsed

    async def rest(self) -> list[str]:
        """Everything until curl exits (the stream closed), then its HTTP status line."""
        assert self.process.stdout is not None
        out = await asyncio.wait_for(self.process.stdout.read(), 10)
        await self.process.wait()
        return [line for line in out.decode().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


async def test_watch_job_as_json_lines_with_curl_until_the_terminal_state(
    db: AsyncEngine, rep: Replica, edge_url: str
) -> None:
    user, job = f"u-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    token = rep.token(user)[0][1].removeprefix("Bearer ")
    await deliver(db, rep, job, user, 1, QUEUED)
    curl = await Curl.get(f"{edge_url}/v1/jobs/{job}:watch", token)
    try:
        first = await curl.line()
        assert first["job"]["status"] == "JOB_STATUS_QUEUED"
        assert first["job"]["version"] == "1"  # int64 is a JSON string
        progress = []
        for version, percent in ((2, 20), (3, 70)):
            await deliver(db, rep, job, user, version, RUNNING, percent)
            message = await curl.line()
            assert message["job"]["status"] == "JOB_STATUS_RUNNING"
            progress.append(message["job"]["progressPercent"])
        assert progress == [20, 70]
        await deliver(db, rep, job, user, 4, SUCCEEDED, 100)
        assert (await curl.line())["job"]["status"] == "JOB_STATUS_SUCCEEDED"
        assert await curl.rest() == ["200"]  # the stream closed after the terminal state
        assert curl.process.returncode == 0
    finally:
        curl.stop()


async def test_watch_jobs_with_curl_resumes_from_its_cursor_with_only_what_it_missed(
    db: AsyncEngine, rep: Replica, edge_url: str
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    token = rep.token(user)[0][1].removeprefix("Bearer ")
    job_a, job_b = str(uuid.uuid4()), str(uuid.uuid4())
    await deliver(db, rep, job_a, user, 1, RUNNING, 10)
    curl = await Curl.get(f"{edge_url}/v1/jobs:watch", token)
    try:
        assert (await curl.line())["job"]["jobId"] == job_a
        marker = await curl.line()
        assert "snapshotEnd" in marker
        cursor = marker["cursor"]
    finally:
        curl.stop()
    await deliver(db, rep, job_a, user, 2, SUCCEEDED, 100)
    await deliver(db, rep, job_b, user, 1, QUEUED)
    again = await Curl.get(f"{edge_url}/v1/jobs:watch?cursor={cursor}", token)
    try:
        got = []
        while "snapshotEnd" not in (message := await again.line()):
            got.append((message["job"]["jobId"], message["job"]["version"]))
        assert sorted(got) == sorted([(job_a, "2"), (job_b, "1")])
    finally:
        again.stop()


async def test_another_users_job_is_a_404_before_any_stream_starts(
    db: AsyncEngine, rep: Replica, edge_url: str
) -> None:
    job = str(uuid.uuid4())
    await deliver(db, rep, job, "owner-1", 1, QUEUED)
    token = rep.token("someone-else")[0][1].removeprefix("Bearer ")
    curl = await Curl.get(f"{edge_url}/v1/jobs/{job}:watch", token)
    lines = await curl.rest()
    assert lines[-1] == "404"
    body = json.loads(lines[0])
    assert body["details"][0]["reason"] == "JOB_NOT_FOUND"


async def test_a_cursor_ahead_of_the_server_is_a_400_before_any_stream_starts(
    db: AsyncEngine, rep: Replica, edge_url: str
) -> None:
    """The README's `?cursor=s42` on a fresh stack, or a saved cursor after the data was
    reset: an HTTP error with the reason, never a stream that stays silent."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    token = rep.token(user)[0][1].removeprefix("Bearer ")
    for cursor in ("s42", "s99999"):
        curl = await Curl.get(f"{edge_url}/v1/jobs:watch?cursor={cursor}", token)
        try:
            lines = await curl.rest()
        finally:
            curl.stop()
        assert lines[-1] == "400", lines
        body = json.loads(lines[0])
        assert body["code"] == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert body["details"][0]["reason"] == "CURSOR_EXPIRED"
        assert "without a cursor" in body["message"]


STREAMS_OVER_THE_DEFAULT_BREAKER = 1_100


async def test_more_streams_than_the_default_circuit_breaker_allows_are_all_served(
    db: AsyncEngine, rep: Replica, the_edge: Edge
) -> None:
    """Main refused 76 of 1,100 WatchJob streams (upstream_rq_active_overflow)."""
    user, job = f"u-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    await deliver(db, rep, job, user, 1, RUNNING, 5)
    # Clients on several connections, as phones are (one HTTP/2 connection to the edge
    # carries at most 100 streams, the edge's max_concurrent_streams); each channel keeps
    # its own connection.
    channels = [
        grpc.aio.insecure_channel(
            the_edge.url.removeprefix("http://"),
            options=[("grpc.use_local_subchannel_pool", 1)],
        )
        for _ in range(12)
    ]
    stubs = [notify_service_pb2_grpc.NotifyServiceStub(c) for c in channels]
    calls = []
    try:
        for number in range(STREAMS_OVER_THE_DEFAULT_BREAKER):
            stub = stubs[number % len(stubs)]
            calls.append(stub.WatchJob(pb.WatchJobRequest(job_id=job), metadata=rep.token(user)))
        firsts = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
        assert all(m.job.version == 1 for m in firsts)
        # Every stream is still open and takes the next change.
        await deliver(db, rep, job, user, 2, RUNNING, 50)
        seconds = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
        assert all(m.job.version == 2 for m in seconds)
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close(grace=None)
    stats = _edge_stats(the_edge.admin_port)
    assert stats.get("cluster.notify_streams.upstream_rq_active_overflow", 0) == 0
    assert stats.get("cluster.notify_streams.upstream_rq_pending_overflow", 0) == 0


def _edge_stats(admin: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=notify_streams") as r:
        text = r.read().decode()
    return {
        name: int(value)
        for name, _, value in (line.partition(": ") for line in text.splitlines())
        if value.strip().isdigit()
    }
