"""Download URLs (picture and thumbnail) for a succeeded job's outputs, filled in when a
stream sends the state, so a client never needs a second call. The projection stores
asset ids only (a URL expires); media signs, all of a state's outputs in one call. The
URLs of an asset are reused until their window ends (media then signs the next
window's, which GetJob hands out) or shortly before they expire, so a state sent to
thousands of streams costs one call to media."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from atelier.creation.v1 import job_pb2
from atelier.media.v1 import media_internal_service_pb2, media_internal_service_pb2_grpc
from services.kit.grpc_client import InternalClient, RemoteFailure
from services.kit.logging import get_logger
from services.kit.outages import Throttle

log = get_logger(__name__)

_SERVICE = "atelier.media.v1.MediaInternalService"
# A URL is handed out only while it has at least this long to live.
FRESH_FOR_SECONDS = 60.0
# The most assets one GetAssetUrls call names (media refuses more).
SIGN_BATCH = 100
# Signed URLs kept; beyond it the least recently used goes.
CACHE_SIZE = 10_000


@dataclass(frozen=True)
class SignedUrl:
    """An asset's signed URLs: the picture, and its thumbnail when media made one; and
    the picture's size in pixels, type and length."""

    url: str
    expire_time: timestamp_pb2.Timestamp
    thumbnail_url: str = ""
    thumbnail_expire_time: timestamp_pb2.Timestamp | None = None
    width: int = 0
    height: int = 0
    content_type: str = ""
    size_bytes: int = 0
    # When media starts signing the next window's URLs (None: media did not say).
    window_end_time: timestamp_pb2.Timestamp | None = None

    @property
    def fresh(self) -> bool:
        """Worth handing out from the cache: media would still answer these very URLs
        (their window has not ended), and they have time left to live."""
        if (
            self.window_end_time is not None
            and time.time() >= self.window_end_time.ToMicroseconds() / 1e6
        ):
            return False
        return self.seconds_left > FRESH_FOR_SECONDS

    @property
    def seconds_left(self) -> float:
        moments = [self.expire_time]
        if self.thumbnail_expire_time is not None:
            moments.append(self.thumbnail_expire_time)
        return min(m.ToMicroseconds() for m in moments) / 1e6 - time.time()


# asset ids -> the signed URLs of those media could sign (none when media failed).
Sign = Callable[[Sequence[str]], Awaitable[dict[str, SignedUrl]]]


class MediaSigner:
    """GetAssetUrls on media's internal listener, with the service credential."""

    def __init__(
        self, address: str, service_token: str, tls: grpc.ChannelCredentials | None = None
    ) -> None:
        self._client = InternalClient(
            address,
            service_token,
            service=_SERVICE,
            idempotent_methods=("GetAssetUrls",),
            tls=tls,
        )
        self._stub: Any = None
        self._throttle = Throttle()

    async def __call__(self, asset_ids: Sequence[str]) -> dict[str, SignedUrl]:
        if self._stub is None:
            self._stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(
                self._client.channel
            )
        try:
            reply = await self._stub.GetAssetUrls(
                media_internal_service_pb2.GetAssetUrlsRequest(asset_ids=list(asset_ids)),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            failure = RemoteFailure.of(error)
            if self._throttle.admit(f"GetAssetUrls:{failure.reason}") is not None:
                log.warning("media_call_failed", call="GetAssetUrls", reason=failure.reason)
            return {}
        return {signed.asset_id: _signed(signed) for signed in reply.assets}

    async def close(self) -> None:
        await self._client.close()


def _signed(signed: media_internal_service_pb2.AssetUrls) -> SignedUrl:
    thumbnail = signed.thumbnail_url_expire_time if signed.thumbnail_url else None
    return SignedUrl(
        signed.url,
        signed.url_expire_time,
        signed.thumbnail_url,
        thumbnail,
        width=signed.width,
        height=signed.height,
        content_type=signed.content_type,
        size_bytes=signed.size_bytes,
        window_end_time=signed.window_end_time if signed.HasField("window_end_time") else None,
    )


class OutputUrls:
    """Adds download URLs to a SUCCEEDED state's outputs (a copy: the state itself is
    shared by every stream that sends it)."""

    def __init__(self, sign: Sign) -> None:
        self._sign = sign
        self._cache: OrderedDict[str, SignedUrl] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future[SignedUrl | None]] = {}

    @staticmethod
    def needed(state: job_pb2.Job) -> bool:
        """Whether :meth:`fill` would add anything (a succeeded job with outputs): the
        streams send every other state as it is, serialized once for all of them."""
        outputs: Any = getattr(state, "outputs", None)
        return state.status == job_pb2.JOB_STATUS_SUCCEEDED and bool(outputs)

    async def fill(self, state: job_pb2.Job) -> job_pb2.Job:
        if not self.needed(state):
            return state
        signed = await self.urls([o.asset_id for o in state.outputs if o.asset_id])
        return _filled(state, signed)

    async def fill_all(self, states: Sequence[job_pb2.Job]) -> list[job_pb2.Job]:
        """Each of ``states``, the succeeded ones with their URLs (signed in as few calls as
        media takes)."""
        wanted = list(
            dict.fromkeys(
                o.asset_id for s in states if self.needed(s) for o in s.outputs if o.asset_id
            )
        )
        if not wanted:
            return list(states)
        signed: dict[str, SignedUrl] = {}
        for start in range(0, len(wanted), SIGN_BATCH):
            signed.update(await self.urls(wanted[start : start + SIGN_BATCH]))
        return [_filled(s, signed) if self.needed(s) else s for s in states]

    async def urls(self, asset_ids: Sequence[str]) -> dict[str, SignedUrl]:
        """URLs with time left for those of the assets media signs: cached ones as they
        are, the rest signed in one call (an asset being signed for another stream at the
        same moment is waited for, not signed twice)."""
        found: dict[str, SignedUrl] = {}
        waiting: dict[str, asyncio.Future[SignedUrl | None]] = {}
        to_sign: list[str] = []
        for asset_id in dict.fromkeys(asset_ids):
            cached = self._cache.get(asset_id)
            if cached is not None and cached.fresh:
                self._cache.move_to_end(asset_id)
                found[asset_id] = cached
            elif asset_id in self._in_flight:
                waiting[asset_id] = self._in_flight[asset_id]
            else:
                to_sign.append(asset_id)
        if to_sign:
            found.update(await self._sign_now(to_sign))
        for asset_id, pending in waiting.items():
            signed = await asyncio.shield(pending)
            if signed is not None:
                found[asset_id] = signed
        return found

    async def _sign_now(self, asset_ids: list[str]) -> dict[str, SignedUrl]:
        loop = asyncio.get_running_loop()
        futures = {asset_id: loop.create_future() for asset_id in asset_ids}
        self._in_flight.update(futures)
        try:
            signed = await self._sign(asset_ids)
            for asset_id, future in futures.items():
                future.set_result(signed.get(asset_id))
        except BaseException as error:
            for future in futures.values():
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved: waiters see it, nobody else must
            raise
        finally:
            for asset_id in asset_ids:
                del self._in_flight[asset_id]
        for asset_id, url in signed.items():
            if asset_id in futures:
                self._cache[asset_id] = url
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return {a: u for a, u in signed.items() if a in futures}


def _filled(state: job_pb2.Job, signed: dict[str, SignedUrl]) -> job_pb2.Job:
    """A copy of ``state`` with the URLs ``signed`` holds for its outputs."""
    filled = job_pb2.Job()
    filled.CopyFrom(state)
    for output in filled.outputs:
        found = signed.get(output.asset_id)
        if found is None:
            continue
        output.url = found.url
        output.url_expire_time.CopyFrom(found.expire_time)
        output.width, output.height = found.width, found.height
        output.content_type, output.size_bytes = found.content_type, found.size_bytes
        if found.thumbnail_expire_time is not None:
            output.thumbnail_url = found.thumbnail_url
            output.thumbnail_url_expire_time.CopyFrom(found.thumbnail_expire_time)
    return filled
