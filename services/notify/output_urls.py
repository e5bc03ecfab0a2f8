"""Download URLs for a succeeded job's outputs, filled in when a stream sends the state, so
a client never needs a second call. The projection stores asset ids only (a URL expires);
media signs. One URL per asset is reused until shortly before it expires, so a state
sent to thousands of streams costs one call to media."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from atelier.creation.v1 import job_pb2
from atelier.media.v1 import media_internal_service_pb2, media_internal_service_pb2_grpc
from atelier.notify.v1 import job_state_pb2
from services.kit.grpc_client import InternalClient, RemoteFailure
from services.kit.logging import get_logger
from services.kit.outages import Throttle

log = get_logger(__name__)

_SERVICE = "atelier.media.v1.MediaInternalService"
# A URL is handed out only while it has at least this long to live.
FRESH_FOR_SECONDS = 60.0
# Signed URLs kept; beyond it the least recently used goes.
CACHE_SIZE = 10_000


@dataclass(frozen=True)
class SignedUrl:
    url: str
    expire_time: timestamp_pb2.Timestamp

    @property
    def seconds_left(self) -> float:
        return self.expire_time.ToMicroseconds() / 1e6 - time.time()


# asset id -> a signed URL, or None when media could not give one.
Sign = Callable[[str], Awaitable[SignedUrl | None]]


class MediaSigner:
    """GetAssetUrl on media's internal listener, with the service credential."""

    def __init__(self, address: str, service_token: str) -> None:
        self._client = InternalClient(
            address, service_token, service=_SERVICE, idempotent_methods=("GetAssetUrl",)
        )
        self._stub: Any = None
        self._throttle = Throttle()

    async def __call__(self, asset_id: str) -> SignedUrl | None:
        if self._stub is None:
            self._stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(
                self._client.channel
            )
        try:
            reply = await self._stub.GetAssetUrl(
                media_internal_service_pb2.GetAssetUrlRequest(asset_id=asset_id),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            failure = RemoteFailure.of(error)
            if self._throttle.admit(f"GetAssetUrl:{failure.reason}") is not None:
                log.warning("media_call_failed", call="GetAssetUrl", reason=failure.reason)
            return None
        return SignedUrl(reply.download_url, reply.expire_time)

    async def close(self) -> None:
        await self._client.close()


class OutputUrls:
    """Adds download URLs to a SUCCEEDED state's outputs (a copy: the state itself is
    shared by every stream that sends it)."""

    def __init__(self, sign: Sign) -> None:
        self._sign = sign
        self._cache: OrderedDict[str, SignedUrl] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future[SignedUrl | None]] = {}

    @staticmethod
    def needed(state: job_state_pb2.JobState) -> bool:
        """Whether :meth:`fill` would add anything (a succeeded job with outputs): the
        streams send every other state as it is, serialized once for all of them."""
        outputs: Any = getattr(state, "outputs", None)
        return state.status == job_pb2.JOB_STATUS_SUCCEEDED and bool(outputs)

    async def fill(self, state: job_state_pb2.JobState) -> job_state_pb2.JobState:
        if not self.needed(state):
            return state
        filled = job_state_pb2.JobState()
        filled.CopyFrom(state)
        for output in getattr(filled, "outputs", ()):
            if not output.asset_id:
                continue
            signed = await self.url(output.asset_id)
            if signed is not None:
                output.url = signed.url
                output.url_expire_time.CopyFrom(signed.expire_time)
        return filled

    async def url(self, asset_id: str) -> SignedUrl | None:
        """A URL for the asset with time left, signing it (once, however many ask at
        the same moment) when none is cached."""
        cached = self._cache.get(asset_id)
        if cached is not None and cached.seconds_left > FRESH_FOR_SECONDS:
            self._cache.move_to_end(asset_id)
            return cached
        pending = self._in_flight.get(asset_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[SignedUrl | None] = asyncio.get_running_loop().create_future()
        self._in_flight[asset_id] = future
        try:
            signed = await self._sign(asset_id)
            future.set_result(signed)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters see it, nobody else must
            raise
        finally:
            del self._in_flight[asset_id]
        if signed is not None:
            self._cache[asset_id] = signed
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return signed
