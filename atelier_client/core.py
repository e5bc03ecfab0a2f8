"""What the sync and the asyncio client share: the token, the retry policy, the clock and
the jitter (:class:`Core`); the stubs over their channels and the channels they opened
themselves (:class:`ClientBase`)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

import grpc

from atelier.creation.v1 import creation_service_pb2_grpc
from atelier.media.v1 import media_service_pb2_grpc
from atelier.notify.v1 import notify_service_pb2_grpc
from atelier_client.auth import BearerToken, Metadata, Token
from atelier_client.calls import Service
from atelier_client.retry import Attempts, RetryHook, RetryPolicy
from atelier_client.watch import JobsWatch, JobWatch, StateHook

C = TypeVar("C")
Channel = TypeVar("Channel", grpc.Channel, grpc.aio.Channel)

# Reconnect within about a second of a restarted server coming back (gRPC's own backoff
# grows to two minutes); keepalive pings stay above the servers' 10 s minimum interval.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 15_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]

# The longest ``wait`` waits unless told otherwise.
DEFAULT_WAIT = 600.0


def _open_channels(
    open_channel: Callable[[str], C], creation: str, media: str | None, notify: str | None
) -> tuple[C, C, C, list[C]]:
    """One channel per distinct target (one address serves all three services through
    the edge); returns creation's, media's and notify's channel, and the channels opened."""
    opened: dict[str, C] = {}

    def channel(target: str) -> C:
        if target not in opened:
            opened[target] = open_channel(target)
        return opened[target]

    return (
        channel(creation),
        channel(media or creation),
        channel(notify or creation),
        list(opened.values()),
    )


class Core:
    __slots__ = ("_auth", "_clock", "_hook", "_rng", "retry")

    def __init__(
        self,
        token: Token,
        retry: RetryPolicy,
        on_retry: RetryHook | None,
        clock: Callable[[], float],
        rng: random.Random | None,
    ) -> None:
        self._auth = BearerToken(token)
        self.retry = retry
        self._hook = on_retry
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 jitter, not a secret

    def metadata(self) -> Metadata:
        return self._auth.metadata()

    def attempts(self, retryable: bool) -> Attempts:
        return Attempts(self.retry, retryable, self._clock, self._rng, self._hook)

    def watch(self, job_id: str, timeout: float, on_state: StateHook | None) -> JobWatch:
        return JobWatch(job_id, timeout, self.retry, self._clock, self._rng, on_state)

    def watch_jobs(self, cursor: str) -> JobsWatch:
        return JobsWatch(cursor, self.retry, self._rng)

    def with_token(self, token: Token) -> Self:
        twin = copy.copy(self)
        twin._auth = BearerToken(token)
        return twin


class ClientBase(Generic[Channel]):
    """The stubs of one flavour over its channels (the generated stub classes serve grpc
    and grpc.aio channels alike). ``media_channel`` and ``notify_channel`` default to
    ``channel``: the edge serves all three services."""

    def __init__(
        self,
        channel: Channel,
        media_channel: Channel | None,
        notify_channel: Channel | None,
        core: Core,
    ) -> None:
        self._core = core
        self._notify: Any = notify_service_pb2_grpc.NotifyServiceStub(notify_channel or channel)
        self._stubs: dict[Service, Any] = {
            "creation": creation_service_pb2_grpc.CreationServiceStub(channel),
            "media": media_service_pb2_grpc.MediaServiceStub(media_channel or channel),
            "notify": self._notify,
        }
        self._owned: list[Channel] = []

    @classmethod
    def _connected(
        cls,
        open_channel: Callable[[str], Channel],
        addresses: tuple[str, str | None, str | None],
        **arguments: Any,
    ) -> Self:
        first, second, third, opened = _open_channels(open_channel, *addresses)
        client = cls(first, media_channel=second, notify_channel=third, **arguments)
        client._owned = opened
        return client

    def with_token(self, token: Token) -> Self:
        """The same client (same channels) calling as another user; closing it closes
        nothing."""
        twin = self.__class__.__new__(self.__class__)
        twin.__dict__.update(self.__dict__, _core=self._core.with_token(token), _owned=[])
        return twin
