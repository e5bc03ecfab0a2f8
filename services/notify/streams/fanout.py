"""Fan-out of applied states to the streams of every replica.

Without Redis (one replica, ``atelier dev``) a change goes straight to the local streams.
With Redis, it also goes to channels ``job:{id}`` and ``user:{id}``, and each batch pokes
the WatchAllJobs streams of every replica through one message on ``FEED_CHANNEL`` (the
feeds read the projection themselves, so the message carries no state); each replica keeps
one subscriber connection, listening on the channels its streams watch, and relays what
arrives to them. Redis being away costs latency, never correctness: the backstop finds
what Pub/Sub lost, and the subscriber reconnects by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.kit.logging import get_logger
from services.kit.outages import Throttle, log_unavailable
from services.notify.streams.change import Change, from_applied
from services.notify.streams.registry import (
    FEED_CHANNEL,
    StreamRegistry,
    job_channel,
    user_channel,
)

log = get_logger(__name__)

# A publish waits at most this long for Redis: Deliver must not stall on it.
PUBLISH_TIMEOUT_SECONDS = 0.25
# After a failed publish, skip Redis this long (the backstop covers) before trying again.
PUBLISH_PAUSE_SECONDS = 1.0
# The subscriber's reconnect delays: from the first to the last, doubling.
RECONNECT_FIRST_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 2.0
_FEED_CHANNEL = FEED_CHANNEL.encode()


class LocalFanout:
    """The in-process Publisher: applied states go to this replica's streams only."""

    def __init__(self, registry: StreamRegistry) -> None:
        self._registry = registry

    async def publish(self, applied: Sequence[Any]) -> None:
        self._registry.dispatch(from_applied(a) for a in applied)


def _client(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=PUBLISH_TIMEOUT_SECONDS,
        socket_timeout=None,
        health_check_interval=0,
        retry_on_timeout=False,
    )


class RedisFanout:
    """The Publisher for several replicas: the local streams at once, the others through
    Redis. Also this replica's subscriber (a component: :meth:`run`, :meth:`stop`)."""

    name = "redis-fanout"

    def __init__(self, registry: StreamRegistry, url: str) -> None:
        self._registry = registry
        self._url = url
        self._publisher = _client(url)
        self._paused_until = 0.0
        self._throttle = Throttle()
        self._channels_changed = asyncio.Event()
        self._to_add: set[str] = set()
        self._to_remove: set[str] = set()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # Set while the subscriber is connected and listening (tests and health look).
        self.connected = asyncio.Event()
        registry.add_listener(self)

    # -- publishing ------------------------------------------------------------------

    async def publish(self, applied: Sequence[Any]) -> None:
        changes = [from_applied(a) for a in applied]
        self._registry.dispatch(changes)
        await self.publish_changes(changes)

    async def publish_changes(self, changes: Sequence[Change]) -> None:
        """Publishes to Redis only (the local streams already have them)."""
        if not changes or time.monotonic() < self._paused_until:
            return
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
                pipe = self._publisher.pipeline(transaction=False)
                for change in changes:
                    payload = change.to_bytes()
                    pipe.publish(job_channel(change.job_id), payload)
                    pipe.publish(user_channel(change.user_id), payload)
                pipe.publish(FEED_CHANNEL, str(max(c.seq for c in changes)))
                await pipe.execute()
        except (RedisError, OSError, TimeoutError) as error:
            self._paused_until = time.monotonic() + PUBLISH_PAUSE_SECONDS
            log_unavailable(self._throttle, "redis", type(error).__name__, during="publish")

    # -- the registry's channels ------------------------------------------------------

    def channels_added(self, channels: Iterable[str]) -> None:
        for channel in channels:
            self._to_remove.discard(channel)
            self._to_add.add(channel)
        self._channels_changed.set()

    def channels_removed(self, channels: Iterable[str]) -> None:
        for channel in channels:
            self._to_add.discard(channel)
            self._to_remove.add(channel)
        self._channels_changed.set()

    # -- subscribing -------------------------------------------------------------------

    async def run(self) -> None:
        self._task = asyncio.current_task()
        delay = RECONNECT_FIRST_SECONDS
        while not self._stopping:
            try:
                await self._subscribe_and_relay()
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            except (RedisError, OSError, TimeoutError) as error:
                self.connected.clear()
                log_unavailable(self._throttle, "redis", type(error).__name__, during="subscribe")
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                continue
            delay = RECONNECT_FIRST_SECONDS

    async def _subscribe_and_relay(self) -> None:
        client = _client(self._url)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        updater: asyncio.Task[None] | None = None
        try:
            # Every channel watched now; later changes go through the updater.
            self._to_add.clear()
            self._to_remove.clear()
            await pubsub.subscribe("atelier:notify:hello", *self._registry.channels())
            updater = asyncio.create_task(self._update_channels(pubsub), name="redis-channels")
            self.connected.set()
            log.info("redis_subscribed", channels=len(self._registry.channels()))
            while True:
                message = await pubsub.get_message(timeout=None)
                if updater.done():
                    updater.result()  # its failure is the connection's
                if message is None or message.get("type") != "message":
                    continue
                if message.get("channel") == _FEED_CHANNEL:
                    self._registry.poke_feeds()
                    continue
                self._relay(message["data"])
        finally:
            self.connected.clear()
            if updater is not None:
                updater.cancel()
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            await client.aclose()

    async def _update_channels(self, pubsub: Any) -> None:
        """Sends SUBSCRIBE / UNSUBSCRIBE for the channels local streams started or
        stopped watching, in batches (the replies arrive on the reading side)."""
        while True:
            await self._channels_changed.wait()
            self._channels_changed.clear()
            added, removed = list(self._to_add), list(self._to_remove)
            self._to_add.clear()
            self._to_remove.clear()
            if added:
                await pubsub.subscribe(*added)
            if removed:
                await pubsub.unsubscribe(*removed)

    def _relay(self, payload: bytes) -> None:
        try:
            change = Change.from_bytes(payload)
        except Exception:
            log.warning("redis_message_unreadable", size=len(payload))
            return
        self._registry.dispatch((change,))

    async def stop(self, deadline: float) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        await self._publisher.aclose()
