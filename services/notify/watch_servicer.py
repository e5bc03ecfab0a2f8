"""NotifyService's streams: WatchJob and WatchJobs (the contract's rules are in
notify_service.proto). A queued job's standing in the queue (streams/standings.py) rides
on the Job messages and KeepAlives the streams send. The token RPCs live in
devices_servicer.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

from google.protobuf import duration_pb2, timestamp_pb2
from grpc import aio

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.kit import deadlines
from services.kit.auth import current_principal
from services.kit.errors import ApiError, internal
from services.kit.logging import get_logger
from services.notify import fields
from services.notify.errors import CursorExpired, JobNotFound
from services.notify.fields import encode_cursor
from services.notify.output_urls import OutputUrls
from services.notify.settings import StreamSettings
from services.notify.streams.change import Change, Snapshot
from services.notify.streams.inbox import EndReason, Inbox
from services.notify.streams.registry import StreamRegistry, UserWatch

log = get_logger(__name__)
Context = aio.ServicerContext[Any, Any]
LatestOfJob = Callable[[str], Awaitable[Change | None]]
UserSnapshot = Callable[[str, int | None, int], Awaitable[Snapshot]]


class StandingsHeld(Protocol):
    def of(self, job_id: str, version: int) -> pb.JobStanding | None: ...


class NoStandings:
    """No standing is ever held (a notify without creation to ask)."""

    def of(self, job_id: str, version: int) -> pb.JobStanding | None:
        return None


_END_REASONS = {
    EndReason.DRAINING: pb.STREAM_END_REASON_DRAINING,
    EndReason.MAX_DURATION: pb.STREAM_END_REASON_MAX_DURATION,
    EndReason.SLOW_READER: pb.STREAM_END_REASON_SLOW_READER,
}
# Reconnect delays per reason, jittered so that clients ended together spread out.
_RETRY_DELAY_SECONDS = {
    EndReason.DRAINING: (0.5, 3.0),
    EndReason.MAX_DURATION: (0.0, 1.0),
    EndReason.SLOW_READER: (1.0, 2.0),
}


def stream_end(reason: EndReason) -> pb.StreamEnd:
    low, high = _RETRY_DELAY_SECONDS[reason]
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(int(random.uniform(low, high) * 1000))  # noqa: S311 (jitter)
    return pb.StreamEnd(reason=_END_REASONS[reason], retry_delay=delay)


def _keep_alive(standings: StandingsHeld, inbox: Inbox) -> pb.KeepAlive:
    """A KeepAlive with the standing of each job the stream last sent QUEUED (the
    streams send what is pending before a keep-alive: what they took is what they sent)."""
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    held = (standings.of(j, inbox.seen_version(j)) for j in sorted(inbox.queued_jobs))
    return pb.KeepAlive(send_time=now, standings=[s for s in held if s is not None])


def _with_standing(state: job_pb2.Job, standing: pb.JobStanding) -> job_pb2.Job:
    """A copy of the shared ``state`` carrying ``standing``."""
    copy = job_pb2.Job()
    copy.CopyFrom(state)
    copy.queue_position = standing.queue_position
    if standing.HasField("estimated_start_time"):
        copy.estimated_start_time.CopyFrom(standing.estimated_start_time)
    return copy


async def _write_error(
    context: Context,
    error: Exception,
    response: type[pb.WatchJobResponse] | type[pb.WatchJobsResponse],
) -> NoReturn:
    """A stream that failed after its first message: the error as the stream's last
    message, then as the RPC's status. A failed write of it (the client gone) leaves
    the status to say it."""
    api = error if isinstance(error, ApiError) else internal()
    log.exception("stream_failed", rpc=response.__name__.removesuffix("Response"))
    with contextlib.suppress(Exception):
        await context.write(response(error=api.to_status()))
    raise api from error


def _inbox(settings: StreamSettings, limit: int) -> Inbox:
    """A stream's inbox, with the moment it ends by itself (its maximum duration,
    jittered so that streams opened together do not all reconnect together)."""
    now = asyncio.get_running_loop().time()
    jitter = random.uniform(0.9, 1.0)  # noqa: S311 (spreads reconnects, not security)
    return Inbox(limit, now=now, deadline=now + settings.max_duration_seconds * jitter)


class WatchServicer(notify_service_pb2_grpc.NotifyServiceServicer):
    def __init__(
        self,
        registry: StreamRegistry,
        settings: StreamSettings,
        latest_of_job: LatestOfJob,
        user_snapshot: UserSnapshot,
        output_urls: OutputUrls,
        standings: StandingsHeld | None = None,
    ) -> None:
        self._output_urls = output_urls
        self._standings: StandingsHeld = standings or NoStandings()
        self._registry = registry
        self._settings = settings
        self._latest_of_job = latest_of_job
        self._user_snapshot = user_snapshot

    # The streams write their messages with context.write rather than yield them: a
    # handler that is a coroutine saves each message an async generator's step, which a
    # broadcast pays once per stream (docs/benchmarks.md). A message may be written
    # already serialized (bytes): the stack's response serializer sends it as it is
    # (kit.interceptors). The generated base declares iterators, hence the ignores.
    async def WatchJob(  # type: ignore[override]
        self, request: pb.WatchJobRequest, context: Context
    ) -> None:
        user_id = current_principal().user_id
        job_id = fields.job_id(request.job_id)
        fields.after_version(request.after_version)
        inbox = _inbox(self._settings, limit=1)
        inbox.skip_through(job_id, request.after_version)
        # Registered before the first read: nothing applied after it can slip between.
        self._registry.watch_job(job_id, inbox)
        try:
            first = await self._first_state(job_id, inbox)
            # A deleted job is gone, as it is from GetJob.
            if first is None or first.user_id != user_id or first.state.deleted:
                raise JobNotFound(job_id)
            if first.terminal and first.version <= request.after_version:
                return  # the client already has the end
            inbox.offer(first)
            # The sending loop lives here rather than in a helper: one frame less per open
            # stream, and there may be ten thousand.
            loop = asyncio.get_running_loop()
            write = context.write
            try:
                while True:
                    for change in inbox.take():
                        if self._output_urls.needed(change.state):
                            state = await self._output_urls.fill(change.state)
                            await write(pb.WatchJobResponse(job=state))
                        elif (
                            change.queued
                            and (standing := self._standings.of(change.job_id, change.version))
                            is not None
                        ):
                            state = _with_standing(change.state, standing)
                            await write(pb.WatchJobResponse(job=state))
                        else:
                            # Serialized once for every stream (see kit.interceptors).
                            await write(change.job_response())
                        inbox.last_sent = loop.time()
                        if change.terminal:
                            return
                    if inbox.ended is not None:
                        await write(pb.WatchJobResponse(end=stream_end(inbox.ended)))
                        return
                    if inbox.keep_alive_due:
                        inbox.keep_alive_due = False
                        keep_alive = _keep_alive(self._standings, inbox)
                        await write(pb.WatchJobResponse(keep_alive=keep_alive))
                        inbox.last_sent = loop.time()
                    if (woken := inbox.wake_up()) is not None:
                        await woken
            except Exception as error:
                await _write_error(context, error, pb.WatchJobResponse)
        finally:
            self._registry.unwatch_job(job_id, inbox)

    async def _first_state(self, job_id: str, inbox: Inbox) -> Change | None:
        """The job's state now; a job the projection does not hold yet (just submitted,
        its first state still on the way) is waited for a little."""
        state = await self._latest_of_job(job_id)
        if state is not None:
            return state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.first_state_wait_seconds
        while (remaining := deadline - loop.time()) > 0:
            # Waiting for the job is what the caller asked for: not the call's deadline.
            with deadlines.paused():
                if not await inbox.wait(remaining):
                    break
            pending = inbox.peek()
            if pending:
                return pending[-1]
            if inbox.ended is not None:
                break  # draining before the job appeared
            # A keep-alive owed: none is sent before the job is known to be the caller's.
            inbox.keep_alive_due = False
            inbox.take()
        return await self._latest_of_job(job_id)

    async def WatchJobs(  # type: ignore[override]
        self, request: pb.WatchJobsRequest, context: Context
    ) -> None:
        user_id = current_principal().user_id
        after_seq = fields.decode_cursor(request.cursor)
        inbox = _inbox(self._settings, limit=self._settings.pending_limit)
        watch = UserWatch(user_id, inbox)
        self._registry.watch_user(watch)
        try:
            snapshot = await self._user_snapshot(user_id, after_seq, self._settings.snapshot_limit)
            # Decided before the first message: through the edge, that fixes the HTTP status.
            if snapshot.expired:
                raise CursorExpired("too much changed since this cursor")
            if snapshot.ahead:
                raise CursorExpired(
                    "this cursor is ahead of your latest change (the server's data was reset,"
                    " or it was not handed out to you)"
                )
            inbox.settle(snapshot.changes, snapshot.cursor)
            await self._send_jobs(inbox, snapshot.cursor, context)
        finally:
            self._registry.unwatch_user(watch)

    async def _send_jobs(self, inbox: Inbox, snapshot_cursor: int, context: Context) -> None:
        loop = asyncio.get_running_loop()
        write = context.write
        cursor = 0
        snapshot_sent = False
        try:
            while True:
                for change in inbox.take():
                    cursor = max(cursor, change.seq)
                    if self._output_urls.needed(change.state):
                        state = await self._output_urls.fill(change.state)
                        await write(pb.WatchJobsResponse(job=state, cursor=encode_cursor(cursor)))
                    elif (
                        change.queued
                        and (standing := self._standings.of(change.job_id, change.version))
                        is not None
                    ):
                        state = _with_standing(change.state, standing)
                        await write(pb.WatchJobsResponse(job=state, cursor=encode_cursor(cursor)))
                    else:
                        await write(change.jobs_response(encode_cursor(cursor)))
                    inbox.last_sent = loop.time()
                if not snapshot_sent:
                    snapshot_sent = True
                    cursor = max(cursor, snapshot_cursor)
                    await write(
                        pb.WatchJobsResponse(
                            snapshot_end=pb.SnapshotEnd(), cursor=encode_cursor(cursor)
                        )
                    )
                    inbox.last_sent = loop.time()
                if inbox.ended is not None:
                    await write(pb.WatchJobsResponse(end=stream_end(inbox.ended)))
                    return
                if inbox.keep_alive_due:
                    inbox.keep_alive_due = False
                    keep_alive = _keep_alive(self._standings, inbox)
                    await write(pb.WatchJobsResponse(keep_alive=keep_alive))
                    inbox.last_sent = loop.time()
                if (woken := inbox.wake_up()) is not None:
                    await woken
        except Exception as error:
            await _write_error(context, error, pb.WatchJobsResponse)
