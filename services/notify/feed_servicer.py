"""NotifyFeedService: WatchAllJobs, the feed of every job change for internal services
(the contract's rules are in notify_feed_service.proto; docs/feed.md).

Unlike WatchJobs, a feed stream is never handed states: it reads the projection itself,
one page of rows after its cursor at a time, oldest change first, and sends them before it
reads the next. The projection's ``seq`` is one cursor for every job and applies commit in
its order (store/projection.py), so what a stream has read up to a cursor is everything up
to it: a resume gets exactly what changed since, each job once at its latest version. The
stream holds one page at most, however slow its reader. It reads again when told that
something was applied (this replica's Deliver, or another's through Redis), at most every
:data:`READ_GAP_SECONDS`, and every poll period in any case (the backstop). The stream
registry owes it keep-alives and ends it (draining, maximum duration) as any stream."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any, NoReturn

from grpc import aio

from atelier.notify.v1 import notify_feed_service_pb2 as pb
from atelier.notify.v1 import notify_feed_service_pb2_grpc, notify_service_pb2
from services.kit import deadlines
from services.kit.auth import current_principal
from services.kit.errors import ApiError, DomainError, internal
from services.kit.logging import get_logger
from services.notify import fields
from services.notify.domain import FeedRequest
from services.notify.errors import CursorExpired
from services.notify.fields import encode_cursor
from services.notify.output_urls import OutputUrls
from services.notify.settings import StreamSettings
from services.notify.store import FeedReads
from services.notify.streams.inbox import Inbox
from services.notify.streams.registry import StreamRegistry
from services.notify.watch_servicer import stream_end

log = get_logger(__name__)
Context = aio.ServicerContext[Any, Any]

# A stream that was told of a change reads at most this often: under load, one read takes
# many changes (a feed's latency is the time to the next read, not a state's fan-out).
READ_GAP_SECONDS = 0.05


def _keep_alive(cursor: int) -> pb.WatchAllJobsResponse:
    alive = notify_service_pb2.KeepAlive()
    alive.send_time.GetCurrentTime()
    return pb.WatchAllJobsResponse(keep_alive=alive, cursor=encode_cursor(cursor))


async def _write_error(context: Context, error: Exception) -> NoReturn:
    """A stream that failed after its first message: the error as its last message, then
    as the RPC's status (a database outage is UNAVAILABLE with RetryInfo, as anywhere)."""
    if isinstance(error, ApiError):
        api = error
    elif isinstance(error, DomainError):
        api = error.to_api_error()
    else:
        api = internal()
        log.exception("stream_failed", rpc="WatchAllJobs")
    with contextlib.suppress(Exception):
        await context.write(pb.WatchAllJobsResponse(error=api.to_status()))
    raise api from error


class FeedServicer(notify_feed_service_pb2_grpc.NotifyFeedServiceServicer):
    def __init__(
        self,
        registry: StreamRegistry,
        settings: StreamSettings,
        poll_period: float,
        reads: FeedReads,
        output_urls: OutputUrls,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._poll_period = poll_period
        self._reads = reads
        self._output_urls = output_urls

    # The generated base declares an iterator; the stream writes with context.write.
    async def WatchAllJobs(  # type: ignore[override]
        self, request: pb.WatchAllJobsRequest, context: Context
    ) -> None:
        wanted = fields.feed_request(request)
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Jittered like every stream's, so feeds opened together do not reconnect together.
        jitter = random.uniform(0.9, 1.0)  # noqa: S311 (spreads reconnects, not security)
        inbox = Inbox(0, now=now, deadline=now + self._settings.max_duration_seconds * jitter)
        # Registered before the first read: a change applied after it pokes the stream.
        self._registry.watch_all(inbox)
        try:
            cursor = await self._start(wanted)
            # The call's deadline bounds its checks, not the replay (a filtered one may read
            # many pages before its first message).
            if (deadline := deadlines.current()) is not None:
                deadline.lift()
            log.info(
                "feed_opened",
                identity=current_principal().identity,
                resumed=wanted.after_seq is not None,
                users=len(wanted.user_ids),
                models=len(wanted.model_ids),
            )
            await self._send(wanted, cursor, inbox, context)
        finally:
            self._registry.unwatch_all(inbox)

    async def _start(self, wanted: FeedRequest) -> int:
        """The cursor the stream reads after; refuses one it cannot resume from (before
        any message: that fixes the status a client sees)."""
        start = await self._reads.start(wanted.after_seq, self._settings.feed_replay_limit)
        if wanted.after_seq is None:
            return start.latest
        if wanted.after_seq > start.latest:
            raise CursorExpired(
                "this cursor is ahead of the latest change (the server's data was reset,"
                " or it was not handed out)"
            )
        if start.too_many_since:
            raise CursorExpired(
                f"more than {self._settings.feed_replay_limit} jobs changed since this cursor"
            )
        return wanted.after_seq

    async def _send(self, wanted: FeedRequest, cursor: int, inbox: Inbox, context: Context) -> None:
        loop = asyncio.get_running_loop()
        write = context.write
        page_size = self._settings.feed_page_size
        caught_up = False
        last_read = float("-inf")
        try:
            while True:
                # Cleared before the read: a change applied during it pokes again.
                inbox.take()
                gap = last_read + READ_GAP_SECONDS - loop.time()
                if gap > 0:
                    await asyncio.sleep(gap)  # a rate limit, not a synchronisation
                last_read = loop.time()
                page = await self._reads.page(cursor, wanted.user_ids, page_size)
                sent = [c for c in page.changes if wanted.wants(c.state.model_id)]
                states = await self._output_urls.fill_all([c.state for c in sent])
                for state, seq in zip(states, (c.seq for c in sent), strict=True):
                    await write(pb.WatchAllJobsResponse(job=state, cursor=encode_cursor(seq)))
                    inbox.last_sent = loop.time()
                # Past the rows the model filter left out, too (a keep-alive carries it).
                cursor = page.last_seq
                if inbox.ended is not None:
                    await write(pb.WatchAllJobsResponse(end=stream_end(inbox.ended)))
                    return
                if page.full:
                    continue  # catching up: the next page at once
                if not caught_up:
                    caught_up = True
                    await write(
                        pb.WatchAllJobsResponse(
                            snapshot_end=notify_service_pb2.SnapshotEnd(),
                            cursor=encode_cursor(cursor),
                        )
                    )
                    inbox.last_sent = loop.time()
                if inbox.keep_alive_due:
                    inbox.keep_alive_due = False
                    await write(_keep_alive(cursor))
                    inbox.last_sent = loop.time()
                # Until poked (a change applied, a keep-alive owed, an end), or the
                # backstop's period has passed.
                await inbox.wait(self._poll_period)
        except Exception as error:
            await _write_error(context, error)
