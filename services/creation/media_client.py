"""creation's view of media, over media's internal gRPC listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2

from atelier.media.v1 import asset_pb2, media_internal_service_pb2, media_internal_service_pb2_grpc
from services.creation.coalesce import Coalescer
from services.creation.errors import InputUrlRefused, MediaUnavailable
from services.kit.grpc_client import InternalClient, RemoteFailure
from services.kit.logging import get_logger
from services.kit.outages import Throttle
from services.kit.sizes import byte_size
from services.kit.timestamps import field_time, from_timestamp

log = get_logger(__name__)

Key = TypeVar("Key")
Value = TypeVar("Value")
Reply = TypeVar("Reply")

# Well inside a client's own deadline: a frozen media costs a submit this long, not more.
CALL_TIMEOUT_SECONDS = 2.0
_PURPOSES = {
    asset_pb2.ASSET_PURPOSE_AI_INPUT: "ai_input",
    asset_pb2.ASSET_PURPOSE_AI_OUTPUT: "ai_output",
}
_PURPOSE_CODES = {name: code for code, name in _PURPOSES.items()}
_STATUSES = {
    asset_pb2.ASSET_STATUS_UPLOADING: "uploading",
    asset_pb2.ASSET_STATUS_READY: "ready",
    asset_pb2.ASSET_STATUS_DELETED: "deleted",
}


@dataclass(frozen=True)
class AssetInfo:
    asset_id: str
    owner_user_id: str
    purpose: str
    status: str


@dataclass(frozen=True)
class DownloadUrl:
    url: str
    expires_at: datetime


@dataclass(frozen=True)
class OutputUrls:
    """An output's picture and its thumbnail (None when media made none), both signed,
    and what a client lays the picture out with: its size in pixels, type and length."""

    image: DownloadUrl
    thumbnail: DownloadUrl | None
    width: int = 0
    height: int = 0
    content_type: str = ""
    size_bytes: int = 0


# GetAssetUrls takes at most this many ids per call.
MAX_URL_BATCH = 100
# ReserveOutputUploads and CompleteOutputUploads take at most this many items per call.
MAX_OUTPUT_BATCH = 100


# Reads, and deletes that may be repeated: a retry after UNAVAILABLE can do no harm.
# PutAsset is not here: a call without a key stores a new asset.
_IDEMPOTENT = (
    "GetAssetInfo",
    "GetAssetUrl",
    "GetAssetUrls",
    "ReadAsset",
    "DeleteAsset",
    "DeleteKeyedAssets",
    # Keyed by the caller: a repeat answers the same asset.
    "ReserveOutputUpload",
    "CompleteOutputUpload",
    "ReserveOutputUploads",
    "CompleteOutputUploads",
)
# Moving an image's bytes takes longer than a metadata call.
TRANSFER_TIMEOUT_SECONDS = 30.0
CHUNK_BYTES = 256 * 1024
# Answers that say "this asset cannot be read", not "try later".
_UNREADABLE = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _unreadable(asset_id: str, error: grpc.aio.AioRpcError) -> AssetUnreadable:
    """In media's words ("the asset was deleted"): the job's error message shows it."""
    return AssetUnreadable(f"input asset {asset_id}: {error.details() or error.code().name}")


class AssetUnreadable(Exception):
    """The asset is missing, not ready, lost or larger than the reader accepts: reading it
    again will not help."""


class AssetRefused(Exception):
    """media refused to store the bytes (not an image it accepts, too large)."""


@dataclass(frozen=True)
class OutputUpload:
    """A reserved output upload: where to PUT its bytes (no URL once it is ready)."""

    asset_id: str
    url: str
    method: str
    headers: dict[str, str]
    expires_at: datetime | None


@dataclass(frozen=True)
class OutputDeclaration:
    """What an output's reservation declares: the same declaration under the same key is
    the same reservation, so concurrent callers of one share its answer."""

    owner_user_id: str
    content_type: str
    size_bytes: int
    sha256: str
    idempotency_key: str


@dataclass(frozen=True)
class OutputCommit:
    owner_user_id: str
    asset_id: str
    idempotency_key: str


class _AskAlone(Exception):
    """A batched call media did not take as a whole (an older media without it, a batch
    it refused): each item is asked for by its single call."""


@dataclass(frozen=True)
class AssetStream:
    """A ready asset's metadata and its bytes, to be read once."""

    content_type: str
    size_bytes: int
    chunks: AsyncIterator[bytes]


@dataclass(frozen=True)
class AssetBytes:
    data: bytes
    content_type: str


_SERVICE = "atelier.media.v1.MediaInternalService"


class MediaClient:
    def __init__(
        self,
        address: str,
        service_token: str,
        timeout_seconds: float = CALL_TIMEOUT_SECONDS,
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._client = InternalClient(
            address,
            service_token,
            service=_SERVICE,
            idempotent_methods=_IDEMPOTENT,
            timeout_seconds=timeout_seconds,
            tls=tls,
        )
        self._stub_instance: (
            media_internal_service_pb2_grpc.MediaInternalServiceAsyncStub | None
        ) = None
        # The inputs' URLs the attempts of a claimed batch ask for together: one
        # GetAssetUrls for them, not a GetAssetUrl each (docs/benchmarks.md, 2026-12-04).
        self._inputs: Coalescer[str, DownloadUrl] = Coalescer(
            self._readable_urls, self._readable_url, MAX_URL_BATCH, shared=(MediaUnavailable,)
        )
        # The outputs the attempts of a batch land together: one ReserveOutputUploads and
        # one CompleteOutputUploads for them, each item answered on its own.
        self._reservations: Coalescer[OutputDeclaration, OutputUpload] = Coalescer(
            self._reserve_many, self._reserve_one, MAX_OUTPUT_BATCH, shared=(MediaUnavailable,)
        )
        self._commits: Coalescer[OutputCommit, str] = Coalescer(
            self._complete_many, self._complete_one, MAX_OUTPUT_BATCH, shared=(MediaUnavailable,)
        )

    @property
    def _stub(self) -> media_internal_service_pb2_grpc.MediaInternalServiceAsyncStub:
        if self._stub_instance is None:
            self._stub_instance = media_internal_service_pb2_grpc.MediaInternalServiceStub(
                self._client.channel
            )
        return self._stub_instance

    async def close(self) -> None:
        await self._client.close()
        self._stub_instance = None

    async def asset_info(self, asset_id: str) -> AssetInfo | None:
        """The asset's metadata; None when media knows no such asset."""
        try:
            reply = await self._stub.GetAssetInfo(
                media_internal_service_pb2.GetAssetInfoRequest(asset_id=asset_id),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            # A malformed id is as unknown as a missing one.
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return None
            raise _unavailable("GetAssetInfo", RemoteFailure.of(error)) from None
        asset = reply.asset
        return AssetInfo(
            asset_id=asset.asset_id,
            owner_user_id=asset.owner_user_id,
            purpose=_PURPOSES.get(asset.purpose, "unknown"),
            status=_STATUSES.get(asset.status, "unknown"),
        )

    async def download_url(self, asset_id: str) -> DownloadUrl | None:
        """A fresh download URL; None when media cannot give one (logged, not raised: a
        job is still worth showing without its picture)."""
        try:
            reply = await self._stub.GetAssetUrl(
                media_internal_service_pb2.GetAssetUrlRequest(asset_id=asset_id),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            _without_urls("GetAssetUrl", error)
            return None
        return DownloadUrl(reply.download_url, from_timestamp(reply.expire_time))

    async def readable_url(self, asset_id: str) -> DownloadUrl:
        """A signed download URL of a ready asset a worker must read: AssetUnreadable when
        media says it cannot be read (missing, deleted, not ready), MediaUnavailable when
        media does not answer. Concurrent callers share one GetAssetUrls; an asset it
        leaves out (not ready, deleted, missing) is asked for alone, for media's word on
        why."""
        return await self._inputs.get(asset_id)

    async def _readable_urls(self, asset_ids: Sequence[str]) -> dict[str, DownloadUrl]:
        """The ready ones among ``asset_ids`` (at most MAX_URL_BATCH), signed."""
        try:
            reply = await self._stub.GetAssetUrls(
                media_internal_service_pb2.GetAssetUrlsRequest(asset_ids=list(asset_ids)),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in _UNREADABLE:
                raise _unreadable(",".join(asset_ids), error) from None
            raise _unavailable("GetAssetUrls", RemoteFailure.of(error)) from None
        return {
            signed.asset_id: DownloadUrl(signed.url, from_timestamp(signed.url_expire_time))
            for signed in reply.assets
            if signed.url
        }

    async def _readable_url(self, asset_id: str) -> DownloadUrl:
        try:
            reply = await self._stub.GetAssetUrl(
                media_internal_service_pb2.GetAssetUrlRequest(asset_id=asset_id),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in _UNREADABLE:
                raise _unreadable(asset_id, error) from None
            raise _unavailable("GetAssetUrl", RemoteFailure.of(error)) from None
        if not reply.download_url:
            raise AssetUnreadable(f"input asset {asset_id}: not ready")
        return DownloadUrl(reply.download_url, from_timestamp(reply.expire_time))

    async def output_urls(self, asset_ids: Sequence[str]) -> dict[str, OutputUrls]:
        """Fresh URLs of the ready assets among ``asset_ids`` (a page of jobs' outputs),
        in one call to media per MAX_URL_BATCH ids. Assets media cannot sign are absent;
        when media fails the answer is empty (logged, not raised: jobs are still worth
        showing without their pictures)."""
        distinct = list(dict.fromkeys(asset_ids))
        found: dict[str, OutputUrls] = {}
        for start in range(0, len(distinct), MAX_URL_BATCH):
            batch = distinct[start : start + MAX_URL_BATCH]
            try:
                reply = await self._stub.GetAssetUrls(
                    media_internal_service_pb2.GetAssetUrlsRequest(asset_ids=batch),
                    **self._client.call_options(),
                )
            except grpc.aio.AioRpcError as error:
                _without_urls("GetAssetUrls", error)
                return {}
            for signed in reply.assets:
                found[signed.asset_id] = _output_urls(signed)
        return found

    async def read_asset(self, asset_id: str, max_bytes: int) -> AssetBytes:
        """A ready asset's bytes, in memory, refused past ``max_bytes``."""
        options = {**self._client.call_options(), "timeout": TRANSFER_TIMEOUT_SECONDS}
        call = self._stub.ReadAsset(
            media_internal_service_pb2.ReadAssetRequest(asset_id=asset_id), **options
        )
        content_type = ""
        data = bytearray()
        try:
            async for message in call:
                if message.HasField("asset"):
                    content_type = message.asset.content_type
                    continue
                data += message.chunk
                if len(data) > max_bytes:
                    call.cancel()
                    raise AssetUnreadable(f"asset {asset_id} is larger than {byte_size(max_bytes)}")
        except grpc.aio.AioRpcError as error:
            if error.code() in _UNREADABLE:
                raise _unreadable(asset_id, error) from None
            raise _unavailable("ReadAsset", RemoteFailure.of(error)) from None
        return AssetBytes(bytes(data), content_type)

    async def open_asset(self, asset_id: str) -> AssetStream:
        """A ready asset's bytes as media streams them, the metadata read first, so a
        missing asset is refused before anything is relayed."""
        options = {**self._client.call_options(), "timeout": TRANSFER_TIMEOUT_SECONDS}
        call = self._stub.ReadAsset(
            media_internal_service_pb2.ReadAssetRequest(asset_id=asset_id), **options
        )
        messages = aiter(call)
        try:
            first = await anext(messages)
        except grpc.aio.AioRpcError as error:
            if error.code() in _UNREADABLE:
                raise _unreadable(asset_id, error) from None
            raise _unavailable("ReadAsset", RemoteFailure.of(error)) from None
        except StopAsyncIteration:
            raise AssetUnreadable(f"asset {asset_id}: no metadata") from None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for message in messages:
                    yield message.chunk
            except grpc.aio.AioRpcError as error:
                raise _unavailable("ReadAsset", RemoteFailure.of(error)) from None
            finally:
                call.cancel()

        return AssetStream(first.asset.content_type, first.asset.size_bytes, chunks())

    async def reserve_output(
        self,
        owner_user_id: str,
        content_type: str,
        size_bytes: int,
        sha256: str,
        idempotency_key: str,
    ) -> OutputUpload:
        """A presigned upload of an output the caller will complete with
        :meth:`complete_output`; the same key and declaration answer the same asset. A
        declaration media refuses (or a key that holds another) is AssetRefused.
        Concurrent callers share one ReserveOutputUploads."""
        return await self._reservations.get(
            OutputDeclaration(owner_user_id, content_type, size_bytes, sha256, idempotency_key)
        )

    async def complete_output(self, owner_user_id: str, asset_id: str, idempotency_key: str) -> str:
        """Checks an uploaded output and makes it READY (its id); repeating it is safe. An
        upload that does not match its declaration, or an asset not reserved for this
        owner and key, is AssetRefused. Concurrent callers share one
        CompleteOutputUploads."""
        return await self._commits.get(OutputCommit(owner_user_id, asset_id, idempotency_key))

    async def _reserve_many(
        self, declarations: Sequence[OutputDeclaration]
    ) -> dict[OutputDeclaration, OutputUpload | Exception]:
        request = media_internal_service_pb2.ReserveOutputUploadsRequest(
            requests=[_reserve_request(declaration) for declaration in declarations]
        )
        reply = await _batch_call(
            "ReserveOutputUploads",
            self._stub.ReserveOutputUploads(request, **self._client.call_options()),
        )
        return _item_answers(
            "ReserveOutputUploads",
            declarations,
            [
                _output_upload(r.reservation) if r.HasField("reservation") else r.error
                for r in reply.results
            ],
        )

    async def _reserve_one(self, declaration: OutputDeclaration) -> OutputUpload:
        try:
            reply = await self._stub.ReserveOutputUpload(
                _reserve_request(declaration), **self._client.call_options()
            )
        except grpc.aio.AioRpcError as error:
            raise _refused_or_unavailable("ReserveOutputUpload", error) from None
        return _output_upload(reply)

    async def _complete_many(
        self, commits: Sequence[OutputCommit]
    ) -> dict[OutputCommit, str | Exception]:
        request = media_internal_service_pb2.CompleteOutputUploadsRequest(
            requests=[_complete_request(commit) for commit in commits]
        )
        options = {**self._client.call_options(), "timeout": TRANSFER_TIMEOUT_SECONDS}
        reply = await _batch_call(
            "CompleteOutputUploads", self._stub.CompleteOutputUploads(request, **options)
        )
        return _item_answers(
            "CompleteOutputUploads",
            commits,
            [str(r.asset.asset_id) if r.HasField("asset") else r.error for r in reply.results],
        )

    async def _complete_one(self, commit: OutputCommit) -> str:
        options = {**self._client.call_options(), "timeout": TRANSFER_TIMEOUT_SECONDS}
        try:
            reply = await self._stub.CompleteOutputUpload(_complete_request(commit), **options)
        except grpc.aio.AioRpcError as error:
            raise _refused_or_unavailable("CompleteOutputUpload", error) from None
        return str(reply.asset.asset_id)

    async def put_asset(
        self,
        owner_user_id: str,
        purpose: str,
        content_type: str,
        data: bytes,
        idempotency_key: str = "",
    ) -> str:
        """Stores server-made bytes as a READY asset of ``owner_user_id``; its id. With an
        ``idempotency_key``, the same key and bytes give the same asset every time; a key
        that holds other bytes, or whose asset was deleted, is AssetRefused."""

        async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
            yield media_internal_service_pb2.PutAssetRequest(
                header=media_internal_service_pb2.PutAssetHeader(
                    owner_user_id=owner_user_id,
                    purpose=_PURPOSE_CODES[purpose],
                    content_type=content_type,
                    idempotency_key=idempotency_key,
                )
            )
            for start in range(0, len(data), CHUNK_BYTES):
                yield media_internal_service_pb2.PutAssetRequest(
                    chunk=data[start : start + CHUNK_BYTES]
                )

        options = {**self._client.call_options(), "timeout": TRANSFER_TIMEOUT_SECONDS}
        try:
            reply = await self._stub.PutAsset(parts(), **options)
        except grpc.aio.AioRpcError as error:
            raise _refused_or_unavailable("PutAsset", error) from None
        except asyncio.CancelledError:
            if _cancelled_by_caller():
                raise
            # Nobody cancelled this task: grpc.aio has been seen to raise CancelledError
            # from a call whose server died mid-call. media went away.
            raise MediaUnavailable(cause="CALL_CANCELLED") from None
        return str(reply.asset.asset_id)

    async def import_asset(
        self, owner_user_id: str, url: str, idempotency_key: str = "", timeout_seconds: float = 15.0
    ) -> str:
        """The id of the READY input asset media made from ``url`` (fetched by media,
        behind its guard); raises InputUrlRefused when media refused the URL or what it
        answered, MediaUnavailable when media did not answer. With ``idempotency_key``
        a repeat answers the asset the first call made."""
        request = media_internal_service_pb2.ImportAssetRequest(
            owner_user_id=owner_user_id, url=url, idempotency_key=idempotency_key
        )
        try:
            reply = await self._stub.ImportAsset(
                request, metadata=self._client.metadata, timeout=timeout_seconds
            )
        except grpc.aio.AioRpcError as error:
            failure = RemoteFailure.of(error)
            if failure.code is grpc.StatusCode.INVALID_ARGUMENT:
                cause = _error_metadata(error).get("cause", failure.reason)
                raise InputUrlRefused(
                    cause, (error.details() or "").removeprefix("url: ")
                ) from None
            raise _unavailable("ImportAsset", failure) from None
        return str(reply.asset.asset_id)

    async def delete_asset(self, asset_id: str) -> None:
        """Deletes an asset; deleting a deleted or unknown one is done already."""
        try:
            await self._stub.DeleteAsset(
                media_internal_service_pb2.DeleteAssetRequest(asset_id=asset_id),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return
            raise _unavailable("DeleteAsset", RemoteFailure.of(error)) from None

    async def delete_keyed_assets(self, owner_user_id: str, idempotency_keys: list[str]) -> int:
        """Deletes ``owner_user_id``'s live assets stored under these keys (what a caller may
        have stored without knowing the ids); how many it deleted. Repeating it is safe."""
        try:
            reply = await self._stub.DeleteKeyedAssets(
                media_internal_service_pb2.DeleteKeyedAssetsRequest(
                    owner_user_id=owner_user_id, idempotency_keys=idempotency_keys
                ),
                **self._client.call_options(),
            )
        except grpc.aio.AioRpcError as error:
            raise _unavailable("DeleteKeyedAssets", RemoteFailure.of(error)) from None
        return len(reply.assets)


def _output_urls(signed: media_internal_service_pb2.AssetUrls) -> OutputUrls:
    image = DownloadUrl(signed.url, from_timestamp(signed.url_expire_time))
    thumbnail = None
    if signed.thumbnail_url:
        thumbnail = DownloadUrl(
            signed.thumbnail_url, from_timestamp(signed.thumbnail_url_expire_time)
        )
    return OutputUrls(
        image, thumbnail, signed.width, signed.height, signed.content_type, signed.size_bytes
    )


# An outage fails every call: one line per call and reason per window is enough.
_log_throttle = Throttle()


def _without_urls(call: str, error: grpc.aio.AioRpcError) -> None:
    """A URL call failed: the caller answers without URLs; said once per reason a window."""
    failure = RemoteFailure.of(error)
    if _log_throttle.admit(f"{call}:{failure.reason}") is not None:
        log.warning("media_call_failed", call=call, reason=failure.reason)


# Answers in which media judged the bytes, the declaration or the key (not an image it
# accepts, too large, a key that holds other bytes or names a deleted asset): landing the
# same output again cannot help, so the attempt fails.
_REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def _error_metadata(error: grpc.aio.AioRpcError) -> dict[str, str]:
    """The ErrorInfo metadata of a failed call (empty when it carried none)."""
    trailers: Any = error.trailing_metadata() or ()
    for key, value in trailers:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # a peer's malformed details must not turn into our bug
            return {}
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return dict(info.metadata)
    return {}


def _reserve_request(
    declaration: OutputDeclaration,
) -> media_internal_service_pb2.ReserveOutputUploadRequest:
    return media_internal_service_pb2.ReserveOutputUploadRequest(
        owner_user_id=declaration.owner_user_id,
        content_type=declaration.content_type,
        size_bytes=declaration.size_bytes,
        sha256=declaration.sha256,
        idempotency_key=declaration.idempotency_key,
    )


def _complete_request(
    commit: OutputCommit,
) -> media_internal_service_pb2.CompleteOutputUploadRequest:
    return media_internal_service_pb2.CompleteOutputUploadRequest(
        asset_id=commit.asset_id,
        owner_user_id=commit.owner_user_id,
        idempotency_key=commit.idempotency_key,
    )


def _output_upload(reply: media_internal_service_pb2.ReserveOutputUploadResponse) -> OutputUpload:
    return OutputUpload(
        reply.asset.asset_id,
        reply.upload_url,
        reply.upload_method,
        dict(reply.upload_headers),
        field_time(reply, "expire_time"),
    )


# What a batched call's own failure means: media refused the batch as a whole, or has no
# such call (an older replica mid-rollout), so each item is asked for alone.
_ASK_ALONE = _REFUSALS | {grpc.StatusCode.UNIMPLEMENTED}


def _batch_failure(call: str, error: grpc.aio.AioRpcError) -> Exception:
    """A batched call that failed as a whole: media unavailable reaches every caller of
    the batch; a refusal of the batch sends each item to its single call."""
    failure = RemoteFailure.of(error)
    if failure.code in _ASK_ALONE:
        return _AskAlone(f"{call}: {failure.code.name} {failure.reason}")
    return _unavailable(call, failure)


async def _batch_call(call: str, answer: Awaitable[Reply]) -> Reply:
    """A batched call's reply; its own failure as _batch_failure says, a CancelledError
    as _cancelled_call does."""
    try:
        return await answer
    except grpc.aio.AioRpcError as error:
        raise _batch_failure(call, error) from None
    except asyncio.CancelledError:
        raise _cancelled_call() from None


def _item_answers(
    call: str, keys: Sequence[Key], results: Sequence[Value | status_pb2.Status]
) -> dict[Key, Value | Exception]:
    """Each key's answer in a batched reply (results in the order of the keys): its value,
    or its own status mapped as the single call's failure would be."""
    answers: dict[Key, Value | Exception] = {}
    for key, result in zip(keys, results, strict=False):
        if isinstance(result, status_pb2.Status):
            answers[key] = _item_refused_or_unavailable(call, RemoteFailure.of_status(result))
        else:
            answers[key] = result
    return answers


def _cancelled_call() -> BaseException:
    """A CancelledError in a batch's own call: the batch's task was cancelled (the loop is
    closing), or grpc.aio raised it because the server died mid-call (media went away)."""
    if _cancelled_by_caller():
        return asyncio.CancelledError()
    return MediaUnavailable(cause="CALL_CANCELLED")


def _cancelled_by_caller() -> bool:
    """Whether the running task has a cancellation pending (a drain, a lost lease, a
    timeout around the call), as opposed to a CancelledError gRPC raised on its own."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _refused_or_unavailable(call: str, error: grpc.aio.AioRpcError) -> Exception:
    """AssetRefused only when media refused the output itself. Anything else, including
    what gRPC reports when a media replica dies mid-call (sometimes INTERNAL or UNKNOWN
    rather than UNAVAILABLE), is media being unavailable: the attempt is handed back and
    polls again, where a failed attempt would submit to the provider a second time."""
    return _item_refused_or_unavailable(call, RemoteFailure.of(error))


def _item_refused_or_unavailable(call: str, failure: RemoteFailure) -> Exception:
    """As _refused_or_unavailable, for one call's answer or one item's in a batch."""
    if failure.code in _REFUSALS:
        return AssetRefused(f"{failure.code.name} {failure.reason}")
    return _unavailable(call, failure)


def _unavailable(call: str, failure: RemoteFailure) -> MediaUnavailable:
    """media's own reason (DATABASE_UNAVAILABLE, DEADLINE_EXCEEDED, ...) becomes the cause
    of our MEDIA_UNAVAILABLE; its retry hint is kept when it gave one."""
    if not failure.transient and _log_throttle.admit(f"{call}:{failure.reason}") is not None:
        # Not an outage (a bad credential, a bug in media): worth an operator's look.
        log.error("media_call_failed", call=call, code=failure.code.name, reason=failure.reason)
    if failure.retry_after_seconds is None:
        return MediaUnavailable(cause=failure.reason)
    return MediaUnavailable(cause=failure.reason, retry_after_seconds=failure.retry_after_seconds)
