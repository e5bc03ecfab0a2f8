"""The local streams of this replica, by the job or user they watch; routes each change
to the inboxes that want it, and tells the fan-out which channels to listen on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Gauge

from services.notify.streams.change import Change
from services.notify.streams.inbox import EndReason, Inbox

OPEN_STREAMS = Gauge(
    "atelier_notify_open_streams",
    "Watch streams open on this replica, by kind: job (WatchJob, one job), user "
    "(WatchJobs, all of a user's jobs) or feed (WatchAllJobs, every job)",
    ["kind"],
)
STREAM_KINDS = ("job", "user", "feed")
_JOB_STREAMS, _USER_STREAMS, _FEED_STREAMS = (OPEN_STREAMS.labels(kind) for kind in STREAM_KINDS)
# Tells the replicas with WatchAllJobs streams that some replica applied changes (the
# payload is the highest cursor applied; the feeds read the projection themselves).
FEED_CHANNEL = "atelier:notify:feed"


def job_channel(job_id: str) -> str:
    return f"job:{job_id}"


def user_channel(user_id: str) -> str:
    return f"user:{user_id}"


class ChannelListener(Protocol):
    """Learns when the first local stream starts watching a channel and when the last one
    stops (the Redis subscriber subscribes and unsubscribes)."""

    def channels_added(self, channels: Iterable[str]) -> None: ...

    def channels_removed(self, channels: Iterable[str]) -> None: ...


@dataclass(frozen=True)
class Watched:
    """What the backstop asks the projection for: per job, versions above ``jobs[id]``;
    per user, cursors above ``users[id]``."""

    jobs: dict[str, int]
    users: dict[str, int]


@dataclass(eq=False)
class UserWatch:
    """A WatchJobs stream's registration."""

    user_id: str
    inbox: Inbox


class StreamRegistry:
    def __init__(self) -> None:
        self._count = 0
        self._empty = asyncio.Event()
        self._empty.set()
        self._by_job: dict[str, set[Inbox]] = {}
        self._by_user: dict[str, set[UserWatch]] = {}
        self._feeds: set[Inbox] = set()
        self._listeners: list[ChannelListener] = []

    def add_listener(self, listener: ChannelListener) -> None:
        self._listeners.append(listener)

    def channels(self) -> list[str]:
        channels = [job_channel(j) for j in self._by_job] + [user_channel(u) for u in self._by_user]
        if self._feeds:
            channels.append(FEED_CHANNEL)
        return channels

    @property
    def stream_count(self) -> int:
        return self._count

    async def wait_empty(self) -> None:
        """Returns once no local stream is open."""
        await self._empty.wait()

    def _counted(self, delta: int, series: Gauge) -> None:
        series.inc(delta)
        self._count += delta
        if self._count:
            self._empty.clear()
        else:
            self._empty.set()

    def watch_job(self, job_id: str, inbox: Inbox) -> None:
        watchers = self._by_job.setdefault(job_id, set())
        if inbox not in watchers:
            watchers.add(inbox)
            self._counted(1, _JOB_STREAMS)
        if len(watchers) == 1:
            self._announce_added(job_channel(job_id))

    def unwatch_job(self, job_id: str, inbox: Inbox) -> None:
        watchers = self._by_job.get(job_id)
        if watchers is None:
            return
        if inbox in watchers:
            watchers.discard(inbox)
            self._counted(-1, _JOB_STREAMS)
        if not watchers:
            del self._by_job[job_id]
            self._announce_removed(job_channel(job_id))

    def watch_user(self, watch: UserWatch) -> None:
        watchers = self._by_user.setdefault(watch.user_id, set())
        if watch not in watchers:
            watchers.add(watch)
            self._counted(1, _USER_STREAMS)
        if len(watchers) == 1:
            self._announce_added(user_channel(watch.user_id))

    def unwatch_user(self, watch: UserWatch) -> None:
        watchers = self._by_user.get(watch.user_id)
        if watchers is None:
            return
        if watch in watchers:
            watchers.discard(watch)
            self._counted(-1, _USER_STREAMS)
        if not watchers:
            del self._by_user[watch.user_id]
            self._announce_removed(user_channel(watch.user_id))

    def watch_all(self, inbox: Inbox) -> None:
        """A WatchAllJobs stream: told of every change (:meth:`poke_feeds`), never sent one."""
        if inbox not in self._feeds:
            self._feeds.add(inbox)
            self._counted(1, _FEED_STREAMS)
            if len(self._feeds) == 1:
                self._announce_added(FEED_CHANNEL)

    def unwatch_all(self, inbox: Inbox) -> None:
        if inbox in self._feeds:
            self._feeds.discard(inbox)
            self._counted(-1, _FEED_STREAMS)
            if not self._feeds:
                self._announce_removed(FEED_CHANNEL)

    def poke_feeds(self) -> None:
        """Some replica applied changes: every WatchAllJobs stream reads what is new."""
        for inbox in self._feeds:
            inbox.poke()

    def dispatch(self, changes: Iterable[Change]) -> int:
        """Offers each change to the streams watching its job or its user; returns how
        many inboxes took one (duplicates are refused by the inboxes themselves). The
        WatchAllJobs streams are poked once when there was any."""
        taken = 0
        any_change = False
        for change in changes:
            any_change = True
            for inbox in self._by_job.get(change.job_id, ()):
                if inbox.offer(change):
                    taken += 1
            for watch in self._by_user.get(change.user_id, ()):
                if watch.inbox.offer(change):
                    taken += 1
        if any_change and self._feeds:
            self.poke_feeds()
        return taken

    def watched(self) -> Watched:
        """The lowest point each watched job and user has reached across local streams:
        the backstop asks for everything above it. A WatchJobs stream also watches, by
        id, the jobs it has seen unfinished, so a change whose cursor arrived out of
        order is still found."""
        jobs: dict[str, int] = {}
        for job_id, inboxes in self._by_job.items():
            jobs[job_id] = min(inbox.seen_version(job_id) for inbox in inboxes)
        users: dict[str, int] = {}
        for user_id, all_watches in self._by_user.items():
            # A stream still reading its snapshot is left out: the snapshot covers it.
            watches = [w for w in all_watches if w.inbox.floor_seq is not None]
            if not watches:
                continue
            users[user_id] = min(w.inbox.max_seq for w in watches)
            for watch in watches:
                for job_id in watch.inbox.open_jobs:
                    seen = watch.inbox.seen_version(job_id)
                    jobs[job_id] = min(jobs.get(job_id, seen), seen)
        return Watched(jobs=jobs, users=users)

    def queued_watchers(self) -> dict[str, list[Inbox]]:
        """The local streams of each job they last took in the QUEUED state."""
        watchers: dict[str, list[Inbox]] = {}
        for inbox in self.inboxes():
            for job_id in inbox.queued_jobs:
                watchers.setdefault(job_id, []).append(inbox)
        return watchers

    def inboxes(self) -> Iterator[Inbox]:
        for inboxes in self._by_job.values():
            yield from inboxes
        for watches in self._by_user.values():
            for watch in watches:
                yield watch.inbox
        yield from self._feeds

    def end_all(self, reason: EndReason) -> None:
        for inboxes in self._by_job.values():
            for inbox in inboxes:
                inbox.end(reason)
        for watches in self._by_user.values():
            for watch in watches:
                watch.inbox.end(reason)
        for inbox in self._feeds:
            inbox.end(reason)

    def _announce_added(self, channel: str) -> None:
        for listener in self._listeners:
            listener.channels_added((channel,))

    def _announce_removed(self, channel: str) -> None:
        for listener in self._listeners:
            listener.channels_removed((channel,))
