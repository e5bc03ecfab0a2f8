"""notify's client streams: commit → client latency and memory at 1, 100, 2,000 and
10,000 concurrent streams on one notify process.

    .venv/bin/python bench/notify_streams.py                      # 1, 100, 2000, 10000
    .venv/bin/python bench/notify_streams.py --streams 100 --updates 500

notify runs as its own process with a Redis of the bench's own (started here, never the
machine's), on a throwaway database. The bench acts as the replica whose Deliver applied
a change: it applies the state to the projection (version-gated upsert, committed), then
publishes it on Redis as Deliver's publisher does; notify's subscriber relays it to the
stream. Latency = from just after the commit to the client holding the message.

Per stream count N:
- **one job**: N WatchJob streams, one job each; updates to random jobs one at a time
  (each awaited): p50/p99 of the commit → client latency.
- **broadcast**: N WatchJob streams on one job; one update reaches all N: the time until
  the last stream has it (and p50/p99 over the streams). ``--clients K`` reads the streams
  in K processes of their own, N/K streams each, as phones each read their own (arrival
  times are ``time.perf_counter()``: CLOCK_MONOTONIC, one clock for every process on the
  host); by default (1) the bench's own process reads them all. A Python client needs
  ~50 µs of CPU per message, about what notify needs to send it: on two vCPUs more reader
  processes than one per core take CPU from notify (docs/benchmarks.md).
- **memory**: notify's resident size with the N streams open, minus its idle size.
- notify's CPU time per delivered stream message (from /proc/<pid>/stat), a figure that
  noise on a shared machine barely moves.

Anchors, measured in the same run: the commit alone, and a bare Redis publish → subscriber
round trip in this process: the floor under the fast path. With ``--bare-broadcast`` also a
bare grpc.aio server (this file with ``--bare-server``: the services' server options, no
interceptors, no Redis, no projection) broadcasting one message to the same number of
streams, read by the same client: the floor under a broadcast, and its CPU per message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.dev import edge, postgres
from services.dev.processes import (
    free_port,
    grpc_serving,
)
from services.kit import migrations
from services.kit.auth import issue_token
from services.kit.db import asyncpg_url
from services.kit.server import SERVER_OPTIONS
from services.kit.settings import DEV_JWT_SECRET
from services.notify.streams.change import from_applied
from services.notify.streams.registry import job_channel, user_channel
from tests.support.edges import running_edge
from tests.support.notify_streams import OwnRedis
from tests.support.projection import apply, ensure_table, job_state

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
USERS = 100
# Streams per client connection: the edge allows 100 per connection (its HTTP/2
# max_concurrent_streams; notify's server 1,000), and phones open a few each.
STREAMS_PER_CHANNEL = 100
IDLE_SAMPLE_SECONDS = 4.0
KEEP_ALIVE_SECONDS = 300


def token(user: str) -> tuple[tuple[str, str], ...]:
    value = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user, 3600)
    return (("authorization", f"Bearer {value}"),)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def notify_process(
    database_url: str, redis_url: str, profile: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    public, internal = free_port(), free_port()
    env = {
        **os.environ,
        "ATELIER_ENV": "dev",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_REDIS_URL": redis_url,
        "ATELIER_NOTIFY_PUBLIC_PORT": str(public),
        "ATELIER_NOTIFY_INTERNAL_PORT": str(internal),
        "ATELIER_NOTIFY_METRICS_PORT": str(free_port()),
        "ATELIER_LOG_LEVEL": "WARNING",
        "ATELIER_DRAIN_GRACE": "1",
        # Keep-alives of streams opened together fall due together, 15 s after opening, in
        # the middle of a measurement. Kept out: a keep-alive costs what one stream's share
        # of a broadcast costs (the "µs/stream message" figure), N/15 of them a second.
        "ATELIER_STREAM_KEEP_ALIVE": str(KEEP_ALIVE_SECONDS),
    }
    # With --profile, notify runs under cProfile (written when it stops on SIGTERM).
    profiler = ["-m", "cProfile", "-o", profile] if profile else []
    process = subprocess.Popen([sys.executable, *profiler, "-m", "services.notify"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not grpc_serving(f"127.0.0.1:{public}")():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("notify did not start")
            time.sleep(0.1)
        yield process, public
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def edge_in_front(notify_port: int, work: Path) -> Iterator[tuple[int, int]]:
    """The real edge (deploy/envoy/envoy.yaml) in front of notify; yields its gRPC port
    and its admin port."""
    listen, admin, nowhere = free_port(), free_port(), free_port()
    config = edge.render(
        listen_port=listen,
        admin_port=admin,
        upstream_ports={
            "creation": nowhere,
            "media": nowhere,
            "media_http": nowhere,
            "notify": notify_port,
        },
    )
    with running_edge(config, work) as running:
        yield running.port, running.admin_port


def edge_overflows(admin: int) -> dict[str, int]:
    url = f"http://127.0.0.1:{admin}/stats?filter=notify_streams.upstream_rq_.*overflow"
    with urllib.request.urlopen(url) as response:
        text = response.read().decode()
    return {
        name.strip(): int(value)
        for name, _, value in (line.partition(": ") for line in text.splitlines())
        if value.strip().isdigit()
    }


class Deliverer:
    """The bench's stand-in for Deliver: apply, commit, publish."""

    def __init__(self, engine: AsyncEngine, redis_url: str) -> None:
        self.engine = engine
        self.redis = aioredis.Redis.from_url(redis_url)
        self.versions: dict[str, int] = {}

    async def seed(self, jobs: list[tuple[str, str]]) -> None:
        """Version 1 of many jobs at once, unpublished (no stream watches them yet)."""
        states = []
        for job, user in jobs:
            self.versions[job] = 1
            states.append(job_state(job, user, 1, job_pb2.JOB_STATUS_QUEUED))
        await apply(self.engine, states)

    async def deliver(self, job: str, user: str) -> float:
        """Applies the job's next state; returns the moment just after the commit."""
        version = self.versions.get(job, 0) + 1
        self.versions[job] = version
        status = job_pb2.JOB_STATUS_RUNNING
        applied = await apply(self.engine, [job_state(job, user, version, status, version % 100)])
        committed = time.perf_counter()
        pipe = self.redis.pipeline(transaction=False)
        for item in applied:
            change = from_applied(item)
            payload = change.to_bytes()
            pipe.publish(job_channel(change.job_id), payload)
            pipe.publish(user_channel(change.user_id), payload)
        await pipe.execute()
        return committed


class Streams:
    """N WatchJob streams on several connections; each message's arrival is recorded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.channels: list[grpc.aio.Channel] = []
        self.calls: list[grpc.aio.UnaryStreamCall[pb.WatchJobRequest, pb.WatchJobResponse]] = []
        self.readers: list[asyncio.Task[None]] = []
        # (job, version) -> arrival times, one per stream that got it.
        self.arrivals: dict[tuple[str, int], list[float]] = {}
        self.waiters: dict[tuple[str, int], tuple[int, asyncio.Event]] = {}
        self.retries = 0
        self.assigned = 0

    def _channel(self) -> grpc.aio.Channel:
        # Counted as streams are handed a channel, not as they open: a wave opens
        # concurrently, and a connection takes no more than STREAMS_PER_CHANNEL at once.
        if not self.channels or self.assigned >= len(self.channels) * STREAMS_PER_CHANNEL:
            self.channels.append(
                grpc.aio.insecure_channel(
                    f"127.0.0.1:{self.port}", options=[("grpc.use_local_subchannel_pool", 1)]
                )
            )
        self.assigned += 1
        return self.channels[-1]

    async def open(self, jobs: list[tuple[str, str]]) -> None:
        """One stream per (job, user), opened in waves as clients would; a stream whose
        open fails (UNAVAILABLE under load) retries after a jittered delay. Returns once
        every stream has its first message."""
        wave = 500
        for start in range(0, len(jobs), wave):
            opened = await asyncio.gather(
                *(self._open_one(job, user) for job, user in jobs[start : start + wave])
            )
            if not all(opened):
                raise RuntimeError("a stream failed to open after retries")

    async def _open_one(self, job: str, user: str) -> bool:
        delay = 0.1
        for _ in range(10):
            stub = notify_service_pb2_grpc.NotifyServiceStub(self._channel())
            call = stub.WatchJob(pb.WatchJobRequest(job_id=job), metadata=token(user))
            try:
                first = await call.read()
            except grpc.aio.AioRpcError:
                self.retries += 1
                await asyncio.sleep(random.uniform(0, delay))  # noqa: S311
                delay = min(delay * 2, 5.0)
                continue
            self.calls.append(call)
            self._arrived(job, first, time.perf_counter())
            self.readers.append(asyncio.create_task(self._read(job, call)))
            return True
        return False

    def _arrived(self, job: str, message: pb.WatchJobResponse, now: float) -> None:
        if message.WhichOneof("event") != "job":
            return
        key = (job, message.job.version)
        self.arrivals.setdefault(key, []).append(now)
        waiter = self.waiters.get(key)
        if waiter is not None and len(self.arrivals[key]) >= waiter[0]:
            waiter[1].set()

    async def _read(
        self, job: str, call: grpc.aio.UnaryStreamCall[pb.WatchJobRequest, pb.WatchJobResponse]
    ) -> None:
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                self._arrived(job, message, time.perf_counter())
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # cancelled at the end of the phase

    async def arrived(self, job: str, version: int, count: int, within: float = 30) -> list[float]:
        key = (job, version)
        event = asyncio.Event()
        self.waiters[key] = (count, event)
        if len(self.arrivals.get(key, [])) >= count:
            event.set()
        await asyncio.wait_for(event.wait(), within)
        return self.arrivals[key]

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        for channel in self.channels:
            await channel.close(grace=None)


def quiet_collector() -> None:
    """The client's own collector out of the way (as notify's is, services/notify/app.py):
    thousands of calls' objects are long-lived, and the young collector would walk them
    again and again during a broadcast."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


class Readers:
    """The broadcast's streams: with one client, read in this process; with more, by
    ``clients`` processes of their own (this file with ``--reader``), each recording every
    arrival and, asked for a version, answering with the arrival times of its streams
    once they all have it."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.clients = clients
        self.processes: list[asyncio.subprocess.Process] = []
        self.streams = Streams(port)
        self.job = ""
        self.count = 0

    async def open(self, job: str, user: str, count: int) -> None:
        self.job, self.count = job, count
        self.clients = min(self.clients, count)
        if self.clients <= 1:
            await self.streams.open([(job, user)] * count)
            quiet_collector()
            return
        shares = [count // self.clients + (i < count % self.clients) for i in range(self.clients)]
        for share in shares:
            self.processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    __file__,
                    "--reader",
                    str(self.port),
                    job,
                    user,
                    str(share),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            )
        for process in self.processes:
            line = await self._line(process)
            if line != "ready":
                raise RuntimeError(f"a reader did not open its streams: {line!r}")

    @staticmethod
    async def _line(process: asyncio.subprocess.Process) -> str:
        assert process.stdout is not None
        return (await process.stdout.readline()).decode().strip()

    async def arrived(self, version: int) -> list[float]:
        if not self.processes:
            return await self.streams.arrived(self.job, version, self.count, within=60)
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(f"{version}\n".encode())
            await process.stdin.drain()
        arrivals: list[float] = []
        for process in self.processes:
            arrivals.extend(float(t) for t in (await self._line(process)).split())
        return arrivals

    async def close(self) -> None:
        await self.streams.close()
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in self.processes:
            await process.wait()


async def reader(port: int, job: str, user: str, count: int) -> None:
    """A client process of the broadcast (see Readers): opens ``count`` streams on
    ``job``, then for each version read on stdin prints its streams' arrival times."""
    streams = Streams(port)
    await streams.open([(job, user)] * count)
    quiet_collector()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        arrivals = await streams.arrived(job, int(line), count, within=60)
        print(" ".join(f"{t:.6f}" for t in arrivals), flush=True)
    await streams.close()


class BareWatch(notify_service_pb2_grpc.NotifyServiceServicer):
    """The broadcast anchor's servicer: every WatchJob stream waits on one future per
    message, as notify's do, and sends one prebuilt message, whatever the request."""

    def __init__(self) -> None:
        self.version = 0
        self.message = pb.WatchJobResponse()
        self.waiters: list[asyncio.Future[None]] = []

    def broadcast(self, job: str, version: int) -> None:
        self.version = version
        self.message = pb.WatchJobResponse(job=job_pb2.Job(job_id=job, version=version))
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    async def WatchJob(  # type: ignore[override]
        self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WatchJobResponse]:
        loop = asyncio.get_running_loop()
        sent = -1
        while True:
            # A broadcast while this stream was still sending the last one is sent now.
            if self.version > sent:
                sent = self.version
                yield self.message
                continue
            waiter = loop.create_future()
            self.waiters.append(waiter)
            await waiter


async def bare_server(port: int) -> None:
    """The anchor's server process: broadcasts ``job version`` read from stdin."""
    quiet_collector()
    server = grpc.aio.server(options=SERVER_OPTIONS)
    watch = BareWatch()
    notify_service_pb2_grpc.add_NotifyServiceServicer_to_server(watch, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        job, version = line.split()
        watch.broadcast(job, int(version))
    await server.stop(None)


async def bare_broadcast(count: int, clients: int, rounds: int = 5) -> None:
    """The broadcast anchor: ``count`` streams on a bare grpc.aio server, ``rounds``
    broadcasts; prints the last stream's time and the server's CPU per stream message."""
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--bare-server",
        str(port),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # grpc.aio prints each stream it cancels at the end; a failure to start shows as
        # no "ready" line.
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    if (await server.stdout.readline()).strip() != b"ready":
        raise RuntimeError("the bare server did not start")
    job, user = str(uuid.uuid4()), "bench-bare"
    readers = Readers(port, clients)
    await readers.open(job, user, count)
    await asyncio.sleep(0.5)
    spans: list[float] = []
    cpu_before = cpu_seconds(server.pid)
    for version in range(1, rounds + 1):
        started = time.perf_counter()
        server.stdin.write(f"{job} {version}\n".encode())
        await server.stdin.drain()
        arrivals = await readers.arrived(version)
        spans.append((max(arrivals) - started) * 1000)
    cpu = (cpu_seconds(server.pid) - cpu_before) / (rounds * count)
    await readers.close()
    server.stdin.close()
    await server.wait()
    print(
        f"anchor | bare grpc.aio broadcast to {count} streams: last"
        f" {statistics.median(spans):8.1f} ms (median of {rounds}) | server CPU"
        f" {cpu * 1e6:5.1f} µs/stream message",
        flush=True,
    )


async def redis_anchor(redis_url: str, rounds: int) -> list[float]:
    """A bare publish → subscriber round trip in this process, in ms."""
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe("bench:anchor")
    latencies = []
    for _ in range(rounds):
        started = time.perf_counter()
        await client.publish("bench:anchor", b"x" * 120)
        while await pubsub.get_message(timeout=5) is None:
            pass
        latencies.append((time.perf_counter() - started) * 1000)
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    return latencies


def summary(values_ms: list[float]) -> str:
    return f"p50 {percentile(values_ms, 50):7.2f} ms  p99 {percentile(values_ms, 99):7.2f} ms"


async def measure(
    count: int,
    port: int,
    pid: int,
    deliverer: Deliverer,
    updates: int,
    idle_rss: float,
    clients: int,
) -> None:
    users = [f"bench-{uuid.uuid4().hex[:6]}-{i}" for i in range(min(USERS, count))]
    jobs = [(str(uuid.uuid4()), users[i % len(users)]) for i in range(count)]
    # The projection holds every job before its stream opens (1,000 per transaction).
    for start in range(0, len(jobs), 1000):
        await deliverer.seed(jobs[start : start + 1000])
    streams = Streams(port)
    opened = time.perf_counter()
    await streams.open(jobs)
    open_seconds = time.perf_counter() - opened
    await asyncio.sleep(1)  # let the subscriptions settle before measuring memory
    rss = rss_mib(pid)

    # notify's background CPU with the streams open (keep-alives, the backstop's reads),
    # subtracted from the per-update figures below.
    idle_cpu = cpu_seconds(pid)
    await asyncio.sleep(IDLE_SAMPLE_SECONDS)
    idle_rate = (cpu_seconds(pid) - idle_cpu) / IDLE_SAMPLE_SECONDS

    latencies = []
    commit_ms = []
    cpu_before = cpu_seconds(pid)
    phase_started = time.perf_counter()
    for _ in range(updates):
        job, user = random.choice(jobs)  # noqa: S311
        started = time.perf_counter()
        committed = await deliverer.deliver(job, user)
        commit_ms.append((committed - started) * 1000)
        arrivals = await streams.arrived(job, deliverer.versions[job], 1)
        latencies.append((arrivals[0] - committed) * 1000)
    phase = time.perf_counter() - phase_started
    cpu_one = max(0.0, cpu_seconds(pid) - cpu_before - idle_rate * phase) / updates
    await streams.close()

    # Broadcast: N streams on one job.
    job, user = str(uuid.uuid4()), users[0]
    await deliverer.deliver(job, user)
    readers = Readers(port, clients)
    await readers.open(job, user, count)
    await asyncio.sleep(0.5)
    spans: list[float] = []
    per_stream: list[float] = []
    cpu_before = cpu_seconds(pid)
    phase_started = time.perf_counter()
    rounds = 5
    for _ in range(rounds):
        committed = await deliverer.deliver(job, user)
        arrivals = await readers.arrived(deliverer.versions[job])
        per_stream.extend((t - committed) * 1000 for t in arrivals)
        spans.append((max(arrivals) - committed) * 1000)
    phase = time.perf_counter() - phase_started
    cpu_broadcast = max(0.0, cpu_seconds(pid) - cpu_before - idle_rate * phase) / (rounds * count)
    await readers.close()

    print(
        f"{count:>6} streams | one job: {summary(latencies)} (commit alone {summary(commit_ms)})"
        f" | notify CPU {cpu_one * 1e6:6.0f} µs/update"
    )
    print(
        f"{'':>6}         | broadcast to all: last {statistics.median(spans):8.1f} ms (median of"
        f" {rounds}, {readers.clients} client processes), per stream {summary(per_stream)}"
        f" | notify CPU {cpu_broadcast * 1e6:5.1f} µs/stream message"
    )
    print(
        f"{'':>6}         | memory: {rss:6.1f} MiB resident with the streams open"
        f" (+{rss - idle_rss:.1f} MiB over idle, {(rss - idle_rss) * 1024 / count:.1f} KiB"
        f" per stream); opened in {open_seconds:.1f} s ({streams.retries} retried opens);"
        f" idle CPU {idle_rate * 100:.1f}%",
        flush=True,
    )


async def storm(count: int, port: int, pid: int, deliverer: Deliverer) -> None:
    """``count`` clients open their streams in one burst (as after a replica restarts);
    a client whose open fails retries after a jittered, growing delay."""
    job, user = str(uuid.uuid4()), "bench-storm"
    await deliverer.deliver(job, user)
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(max(1, count // STREAMS_PER_CHANNEL))
    ]
    stubs = [notify_service_pb2_grpc.NotifyServiceStub(c) for c in channels]
    retries = 0
    calls: list[grpc.aio.UnaryStreamCall[pb.WatchJobRequest, pb.WatchJobResponse]] = []

    async def client(number: int) -> bool:
        nonlocal retries
        delay = 0.1
        for _ in range(10):
            call = stubs[number % len(stubs)].WatchJob(
                pb.WatchJobRequest(job_id=job), metadata=token(user)
            )
            try:
                await call.read()
                calls.append(call)
                return True
            except grpc.aio.AioRpcError:
                retries += 1
                await asyncio.sleep(random.uniform(0, delay))  # noqa: S311
                delay = min(delay * 2, 5.0)
        return False

    started = time.perf_counter()
    opened = await asyncio.gather(*(client(n) for n in range(count)))
    elapsed = time.perf_counter() - started
    print(
        f"storm | {count} clients at once: {sum(opened)} streams open, {count - sum(opened)}"
        f" gave up, {retries} retries, all open after {elapsed:.1f} s;"
        f" notify {rss_mib(pid):.1f} MiB resident",
        flush=True,
    )
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close(grace=None)


async def run(
    stream_counts: list[int],
    updates: int,
    url: str,
    own_redis: OwnRedis,
    storm_size: int,
    profile: str,
    through_edge: bool,
    work: Path,
    clients: int,
    bare: bool,
) -> None:
    engine = create_async_engine(asyncpg_url(url), pool_size=4)
    await ensure_table(engine)
    deliverer = Deliverer(engine, own_redis.url)
    anchor = await redis_anchor(own_redis.url, 200)
    print(f"anchor | bare Redis publish → subscribe round trip: {summary(anchor)}")
    if bare:
        for count in stream_counts:
            await bare_broadcast(count, clients)
    with contextlib.ExitStack() as stack:
        process, port = stack.enter_context(notify_process(url, own_redis.url, profile))
        admin = 0
        if through_edge:
            port, admin = stack.enter_context(edge_in_front(port, work))
            print("clients connect through the edge (Envoy)", flush=True)
        await asyncio.sleep(1)
        idle = rss_mib(process.pid)
        print(f"notify idle: {idle:.1f} MiB resident", flush=True)
        for count in stream_counts:
            await measure(count, port, process.pid, deliverer, updates, idle, clients)
        if storm_size:
            await storm(storm_size, port, process.pid, deliverer)
        if through_edge:
            print(f"edge | stream cluster overflows: {edge_overflows(admin)}", flush=True)
    await deliverer.redis.aclose()
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 100, 2000, 10000])
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--edge", action="store_true", help="clients connect through Envoy (gRPC)")
    parser.add_argument("--profile", default="", help="run notify under cProfile, into this file")
    parser.add_argument(
        "--storm", type=int, default=5000, help="clients reconnecting at once (0: skip)"
    )
    parser.add_argument(
        "--clients", type=int, default=1, help="processes reading the broadcast's streams"
    )
    parser.add_argument(
        "--bare-broadcast",
        action="store_true",
        help="first, the same broadcasts from a bare grpc.aio server (the anchor)",
    )
    parser.add_argument("--reader", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(bare_server(args.bare_server))
        return
    if args.reader:
        port, job, user, count = args.reader
        asyncio.run(reader(int(port), job, user, int(count)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-notify-") as work:
        admin = os.environ.get("ATELIER_BENCH_POSTGRES_URL", LOCAL_POSTGRES)
        if not postgres.server_answers(admin):
            admin = postgres.start_embedded(Path(work) / "pg")
        name = f"atelier_bench_{uuid.uuid4().hex[:8]}"
        url = postgres.ensure_database(admin, name)
        own_redis = OwnRedis(Path(work))
        own_redis.start()
        try:
            migrations.upgrade("notify", url)
            asyncio.run(
                run(
                    args.streams,
                    args.updates,
                    url,
                    own_redis,
                    args.storm,
                    args.profile,
                    args.edge,
                    Path(work),
                    args.clients,
                    args.bare_broadcast,
                )
            )
        finally:
            own_redis.stop()
            postgres.drop_database(admin, name)


if __name__ == "__main__":
    main()
