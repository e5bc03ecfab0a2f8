"""Clients of a replicated fleet (services.dev.fleet), all through the edge as the app
talks to it: users submit jobs over HTTP/JSON (an Idempotency-Key each, the same key again
when the answer was a retryable error) and follow them on a WatchJobs stream over gRPC,
reconnecting with the last cursor when the stream breaks. Every error a client sees is
kept, to be judged; every job state a stream delivers is kept, with the connection that
delivered it, to check that streams resumed from their cursors."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import grpc
import httpx
from google.protobuf import json_format
from PIL import Image

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET

TERMINAL = frozenset(
    {
        job_pb2.JOB_STATUS_SUCCEEDED,
        job_pb2.JOB_STATUS_FAILED,
        job_pb2.JOB_STATUS_CANCELLED,
        job_pb2.JOB_STATUS_NEEDS_ATTENTION,
    }
)


def fleet_env(stub_duration: float) -> dict[str, str]:
    """Settings for every process of a fleet under load: limits lifted, and a killed
    worker's leases lapse within seconds, the survivors' reapers taking them back."""
    return {
        "ATELIER_STUB_DURATION": str(stub_duration),
        "ATELIER_STUB_LATENCY": "0",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        "ATELIER_WORKER_POLL": "0.5",
        "ATELIER_WORKER_CONCURRENCY": "8",
        # Eight processes share one PostgreSQL (in tests, with every other suite's
        # stacks): small pools keep the fleet well under its connection limit.
        "ATELIER_DB_POOL_SIZE": "2",
        "ATELIER_HEARTBEAT": "1",
        "ATELIER_LEASE_TTL": "5",
        "ATELIER_REAPER_PERIOD": "1",
        "ATELIER_RELAY_BACKOFF_MAX": "1",
        "ATELIER_POLL_PERIOD": "1",
        "ATELIER_DAILY_QUOTA": "100000",
        "ATELIER_IN_FLIGHT_LIMIT": "1000",
        "ATELIER_WELCOME_POINTS": "1000000",
        "ATELIER_DRAIN_GRACE": "2",
    }


# How long a client waits before trying again after a retryable error (the edge says 1 s
# in retry-after; a short, jittered wait keeps the test quick and is what a busy app does).
RETRY_DELAY = 0.2
# How often a client reads a running job it follows.
FOLLOW_PERIOD = 0.3


def picture() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (200, 120, 40)).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class Seen:
    """One job state a stream delivered: on which connection (0 first), and whether in
    that connection's snapshot."""

    connection: int
    version: int
    status: int
    in_snapshot: bool


@dataclass
class Errors:
    """Every error the clients saw: (what, HTTP status or gRPC code name, detail)."""

    http: list[tuple[str, int, str]] = field(default_factory=list)
    grpc: list[tuple[str, str, str]] = field(default_factory=list)
    # A failure below HTTP (a connection the edge broke): none are expected.
    transport: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> Counter[str]:
        """How many of each: the call, and the HTTP status with its ErrorInfo reason or the
        gRPC code."""
        return Counter(
            [f"{what} HTTP {status} {reason_of(body)}" for what, status, body in self.http]
            + [f"{what} gRPC {code}" for what, code, _ in self.grpc]
            + [f"{what} transport {kind}" for what, kind in self.transport]
        )


def reason_of(body: str) -> str:
    """The ErrorInfo reason of a JSON google.rpc.Status body ("" when it has none)."""
    try:
        details = json.loads(body).get("details", [])
    except (ValueError, AttributeError):
        return ""
    return next((str(d["reason"]) for d in details if "reason" in d), "")


# The edge names the replica behind each stream in this response header (the fleet's edge
# config adds it: services.dev.fleet.UPSTREAM_HEADER).
UPSTREAM_HEADER = "x-atelier-upstream"


@dataclass(frozen=True)
class Break:
    """A stream that ended without an answer from the service: its connection, the replica
    behind it, and how it showed (a gRPC code and details, or an HTTP transport error)."""

    connection: int
    upstream: str
    how: str
    detail: str


class Watcher:
    """One user's WatchJobs stream through the edge, reconnecting with its cursor: over
    gRPC, or (``json``) over HTTP/JSON, one object per line, as the app reads it."""

    def __init__(
        self,
        user: LoadUser,
        errors: Errors,
        *,
        channel: grpc.aio.Channel | None = None,
        http: httpx.AsyncClient | None = None,
        edge_url: str = "",
    ) -> None:
        self._stub = notify_service_pb2_grpc.NotifyServiceStub(channel) if channel else None
        self._http = http
        self._edge_url = edge_url
        self.json = channel is None
        self._user = user
        self._errors = errors
        self.seen: dict[str, list[Seen]] = {}
        self.cursor = ""
        # Per connection: the cursor it started from ("" for the first), the replica.
        self.started_from: list[str] = []
        self.upstreams: list[str] = []
        self.breaks: list[Break] = []
        self.live = asyncio.Event()
        self.terminal: dict[str, asyncio.Event] = {}
        self._stopping = False
        # When set, a broken stream reconnects only once this is set (a test holds it to
        # make sure something changed while the stream was away).
        self.resume_gate: asyncio.Event | None = None
        self._call: grpc.aio.UnaryStreamCall[pb.WatchJobsRequest, pb.WatchJobsResponse] | None
        self._call = None
        self._task = asyncio.create_task(self._run())

    @property
    def user_id(self) -> str:
        return self._user.user_id

    def versions_before(self, connection: int) -> dict[str, int]:
        """The highest version of each job seen on connections before ``connection``."""
        return {
            job_id: max(v.version for v in seen if v.connection < connection)
            for job_id, seen in self.seen.items()
            if any(v.connection < connection for v in seen)
        }

    def finished(self, job_id: str) -> asyncio.Event:
        return self.terminal.setdefault(job_id, asyncio.Event())

    def _take(self, message: pb.WatchJobsResponse, connection: int, in_snapshot: bool) -> bool:
        """Records one message; returns whether the snapshot is still going."""
        kind = message.WhichOneof("event")
        if kind == "snapshot_end":
            in_snapshot = False
            self.live.set()
        elif kind == "job":
            state = message.job
            self.seen.setdefault(state.job_id, []).append(
                Seen(connection, state.version, state.status, in_snapshot)
            )
            if state.status in TERMINAL:
                self.finished(state.job_id).set()
        elif kind == "error":
            code = next((c.name for c in grpc.StatusCode if c.value[0] == message.error.code), "")
            self._errors.grpc.append(("WatchJobs message", code, message.error.message))
        if message.cursor:
            self.cursor = message.cursor
        return in_snapshot

    async def _run(self) -> None:
        while not self._stopping:
            connection = len(self.started_from)
            self.started_from.append(self.cursor)
            self.upstreams.append("")
            if self.json:
                await self._read_json(connection)
            else:
                await self._read_grpc(connection)
            if not self._stopping:
                await asyncio.sleep(RETRY_DELAY)
                if self.resume_gate is not None:
                    await self.resume_gate.wait()

    async def _read_grpc(self, connection: int) -> None:
        assert self._stub is not None
        in_snapshot = True
        self._call = self._stub.WatchJobs(
            pb.WatchJobsRequest(cursor=self.cursor), metadata=self._user.metadata
        )
        try:
            for key, value in await self._call.initial_metadata() or ():
                if key == UPSTREAM_HEADER:
                    self.upstreams[connection] = str(value)
            async for message in self._call:
                in_snapshot = self._take(message, connection, in_snapshot)
        except grpc.aio.AioRpcError as error:
            if self._stopping and error.code() == grpc.StatusCode.CANCELLED:
                return
            details = error.details() or ""
            # No status from any server: the edge reset the stream when the replica behind
            # it died (HTTP/2 RST_STREAM, which gRPC reports as INTERNAL "Stream removed").
            reset = error.code() == grpc.StatusCode.INTERNAL and "RST_STREAM" in details
            if reset and not error.trailing_metadata():
                self.breaks.append(
                    Break(connection, self.upstreams[connection], "RST_STREAM", details)
                )
            else:
                self._errors.grpc.append(("WatchJobs", error.code().name, details))

    async def _read_json(self, connection: int) -> None:
        assert self._http is not None
        in_snapshot = True
        url = f"{self._edge_url}/v1/jobs:watch"
        params = {"cursor": self.cursor} if self.cursor else {}
        try:
            async with self._http.stream(
                "GET", url, params=params, headers=self._user.headers, timeout=None
            ) as answer:
                self.upstreams[connection] = answer.headers.get(UPSTREAM_HEADER, "")
                if answer.status_code != 200:
                    body = (await answer.aread()).decode(errors="replace")
                    self._errors.http.append(("WatchJobs", answer.status_code, body[:300]))
                    return
                async for line in answer.aiter_lines():
                    if line.strip():
                        message = json_format.Parse(line, pb.WatchJobsResponse())
                        in_snapshot = self._take(message, connection, in_snapshot)
        except httpx.TransportError as error:
            if self._stopping:
                return
            # The body stopped short of its end: the replica behind it died.
            self.breaks.append(
                Break(connection, self.upstreams[connection], type(error).__name__, str(error))
            )

    async def stop(self) -> None:
        self._stopping = True
        if self._call is not None:
            self._call.cancel()
        self._task.cancel()
        # A call cancelled here ends its reader with CancelledError: that is the stop.
        await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class LoadUser:
    user_id: str
    token: str
    asset_id: str = ""
    # Idempotency key -> the job it made.
    jobs: dict[str, str] = field(default_factory=dict)
    # Keys sent more than once (after a retryable error).
    retried_keys: set[str] = field(default_factory=set)

    @classmethod
    def new(cls, prefix: str) -> LoadUser:
        user_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        return cls(user_id, issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 3600))

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)


class Load:
    """Users, each with ``in_flight`` jobs at a time: submit, wait for the stream to say
    the job finished, submit the next. Completions are timed as the streams report them."""

    def __init__(self, edge_url: str, edge_address: str, users: int, in_flight: int) -> None:
        self.edge_url = edge_url
        self.users = [LoadUser.new("scale") for _ in range(users)]
        self.in_flight = in_flight
        self.errors = Errors()
        # (monotonic time, job id) as each job's terminal state reached its stream.
        self.completed: list[tuple[float, str]] = []
        self.completion = asyncio.Condition()
        self._http = httpx.AsyncClient(timeout=30)
        self._channel = grpc.aio.insecure_channel(edge_address)
        self.watchers: dict[str, Watcher] = {}
        self._running = True
        self._loops: list[asyncio.Task[None]] = []
        self.failure: Exception | None = None

    async def _request(self, what: str, method: str, url: str, **kwargs: object) -> httpx.Response:
        """The answer once it is not a retryable error; each retryable one is kept."""
        while True:
            try:
                answer = await self._http.request(method, url, **kwargs)  # type: ignore[arg-type]
            except httpx.TransportError as error:
                self.errors.transport.append((what, type(error).__name__))
                await asyncio.sleep(RETRY_DELAY)
                continue
            if answer.status_code == 200:
                return answer
            self.errors.http.append((what, answer.status_code, answer.text[:300]))
            if answer.status_code != 503:
                return answer
            await asyncio.sleep(RETRY_DELAY)

    async def _upload(self, user: LoadUser, data: bytes) -> str:
        """The user's photo through the edge, as the app uploads one."""
        reserved = await self._request(
            "CreateUpload",
            "POST",
            f"{self.edge_url}/v1/uploads",
            headers=user.headers,
            json={
                "purpose": "ASSET_PURPOSE_AI_INPUT",
                "contentType": "image/png",
                "sizeBytes": len(data),
            },
        )
        body = reserved.json()
        asset_id = str(body["asset"]["assetId"])
        await self._request(
            "PUT upload",
            "PUT",
            body["uploadUrl"],
            content=data,
            headers={"content-type": "image/png"},
        )
        await self._request(
            "CompleteUpload",
            "POST",
            f"{self.edge_url}/v1/uploads/{asset_id}:complete",
            headers=user.headers,
            json={},
        )
        return asset_id

    async def prepare(self, within: float = 60) -> None:
        """Each user's photo uploaded and stream live (its snapshot ended); fails after
        ``within`` seconds."""
        data = picture()
        for user, asset in zip(
            self.users,
            await asyncio.gather(*(self._upload(user, data) for user in self.users)),
            strict=True,
        ):
            user.asset_id = asset
            # Half the users watch over gRPC, half over HTTP/JSON.
            if len(self.watchers) % 2:
                watcher = Watcher(user, self.errors, http=self._http, edge_url=self.edge_url)
            else:
                watcher = Watcher(user, self.errors, channel=self._channel)
            self.watchers[user.user_id] = watcher
        async with asyncio.timeout(within):
            await asyncio.gather(*(w.live.wait() for w in self.watchers.values()))

    async def submit(self, user: LoadUser) -> str:
        key = uuid.uuid4().hex
        body = {
            "modelId": "stub-fast",
            "styleId": "watercolor",
            "inputAssetId": user.asset_id,
            "prompt": "a fox in the snow",
            "width": 512,
            "height": 512,
        }
        sent = len(self.errors.http) + len(self.errors.transport)
        answer = await self._request(
            "SubmitJob",
            "POST",
            f"{self.edge_url}/v1/jobs",
            headers={**user.headers, "idempotency-key": key},
            json=body,
        )
        if len(self.errors.http) + len(self.errors.transport) > sent:
            user.retried_keys.add(key)
        assert answer.status_code == 200, answer.text
        job_id = str(answer.json()["job"]["jobId"])
        user.jobs[key] = job_id
        return job_id

    async def _one_job(self, user: LoadUser) -> None:
        """A job as the app runs one: submit, follow it (the stream, and a read of the
        job now and then, as a screen refresh would), then download its picture."""
        job_id = await self.submit(user)
        finished = self.watchers[user.user_id].finished(job_id)
        while not finished.is_set():
            await self._request(
                "GetJob", "GET", f"{self.edge_url}/v1/jobs/{job_id}", headers=user.headers
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), FOLLOW_PERIOD)
        job = (
            await self._request(
                "GetJob", "GET", f"{self.edge_url}/v1/jobs/{job_id}", headers=user.headers
            )
        ).json()["job"]
        if job["status"] == "JOB_STATUS_SUCCEEDED":
            picture = await self._request("download", "GET", job["outputs"][0]["url"])
            assert picture.headers["content-type"].startswith("image/"), picture.headers
        async with self.completion:
            self.completed.append((time.monotonic(), job_id))
            self.completion.notify_all()

    async def _user_loop(self, user: LoadUser) -> None:
        try:
            while self._running:
                await self._one_job(user)
        except Exception as error:
            # A client that fails (an answer no client should get) stops the run at once,
            # not when some later wait times out.
            async with self.completion:
                self.failure = error
                self.completion.notify_all()
            raise

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._user_loop(user))
            for user in self.users
            for _ in range(self.in_flight)
        ]

    async def completions(self, count: int, within: float) -> float:
        """The time at which ``count`` jobs had completed; fails after ``within`` seconds."""
        async with asyncio.timeout(within), self.completion:
            await self.completion.wait_for(
                lambda: len(self.completed) >= count or self.failure is not None
            )
            if self.failure is not None:
                raise self.failure
            return self.completed[count - 1][0]

    async def all_finished(self, job_ids: set[str], within: float) -> None:
        """Returns once each of ``job_ids`` reached its stream's terminal state."""
        watchers = {
            job_id: self.watchers[user.user_id]
            for user in self.users
            for job_id in user.jobs.values()
        }
        async with asyncio.timeout(within):
            for job_id in job_ids:
                await watchers[job_id].finished(job_id).wait()

    async def finish(self, within: float) -> None:
        """No new jobs; returns once every submitted job finished on its stream."""
        self._running = False
        async with asyncio.timeout(within):
            await asyncio.gather(*self._loops)

    async def close(self) -> None:
        self._running = False
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.gather(*(w.stop() for w in self.watchers.values()))
        await self._http.aclose()
        await self._channel.close(grace=None)

    def unfinished(self) -> set[str]:
        """The jobs submitted whose terminal state no stream has delivered yet."""
        return {
            job_id
            for user in self.users
            for job_id in user.jobs.values()
            if not self.watchers[user.user_id].finished(job_id).is_set()
        }

    def job_ids(self) -> set[str]:
        return {job_id for user in self.users for job_id in user.jobs.values()}

    def rate(self, first: int, last: int) -> float:
        """Jobs per second between the ``first`` and ``last`` completions (1-based)."""
        start, end = self.completed[first - 1][0], self.completed[last - 1][0]
        return (last - first) / max(end - start, 1e-6)
