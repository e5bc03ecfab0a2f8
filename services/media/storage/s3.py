"""Objects in S3 (or MinIO, or any S3-protocol server) through aiobotocore.

One client per process, opened on first use and closed with the service. Large objects go
up as a multipart upload, one part in memory at a time; presigned PUTs bind the content
type, the exact length and ``If-None-Match: *``, so a client can neither change what it
declared nor replace an object once it exists.

Download URLs may be signed as of a given moment (the start of their window): SigV4's
signature covers the signing time, so two reads within one window get the same URL only
if both sign as of the same second. botocore signs as of now; :class:`_SignedAsOf` is its
own S3 query signer with the moment given, chosen for the signing client's GetObject
presigns only while one is asked for (``_SIGNING_TIME``).
"""

from __future__ import annotations

import asyncio
import base64
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import botocore.auth
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.auth import SIGV4_TIMESTAMP, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, NoCredentialsError

from services.kit import deadlines
from services.kit.logging import get_logger
from services.media.errors import StorageUnavailable
from services.media.settings import S3Settings
from services.media.storage.base import (
    DEFAULT_OBJECT_MAX_AGE_SECONDS,
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    SignedRequest,
    object_cache_control,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

log = get_logger(__name__)

# S3's smallest part (except the last); the most one upload holds in memory.
PART_BYTES = 5 * 1024 * 1024
_MISSING = {"404", "NoSuchKey", "NotFound"}
_TAKEN = {"412", "PreconditionFailed"}


# The moment the presign under way signs as of; None: now (botocore's own signer).
_SIGNING_TIME: ContextVar[datetime | None] = ContextVar("atelier_s3_signing_time", default=None)
# Our signer's name among botocore's (the suffix is what botocore wants of a presigner).
_SIGNED_AS_OF = "s3v4-atelier-signed-as-of-query"


class _SignedAsOf(S3SigV4QueryAuth):
    """botocore's S3 SigV4 query signer, signing as of ``_SIGNING_TIME`` instead of now:
    the same steps as ``SigV4Auth.add_auth``, with the timestamp given. The URL is byte
    for byte the one botocore makes at that moment (tests/integration/test_media_storage.py)."""

    def add_auth(self, request: AWSRequest) -> None:
        moment = _SIGNING_TIME.get()
        if moment is None:
            super().add_auth(request)
            return
        if self.credentials is None:
            raise NoCredentialsError()
        request.context["timestamp"] = moment.astimezone(UTC).strftime(SIGV4_TIMESTAMP)
        # botocore's own steps (private to it, so untyped in its stubs).
        steps: Any = self
        steps._modify_request_before_signing(request)
        canonical_request = self.canonical_request(request)
        string_to_sign = self.string_to_sign(request, canonical_request)
        steps._inject_signature_to_request(request, self.signature(string_to_sign, request))


# Known to botocore by name; chosen only by the handler below, on our signing clients.
botocore.auth.AUTH_TYPE_MAPS[_SIGNED_AS_OF] = _SignedAsOf


def _signer_choice(**_: Any) -> str | None:
    """choose-signer for GetObject: ours while a moment is given, else botocore's choice."""
    return _SIGNED_AS_OF if _SIGNING_TIME.get() is not None else None


# An event handler may answer (choose-signer's do); the stubs say handlers return None.
_choose_signed_as_of = cast(Callable[..., None], _signer_choice)


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _not_answering(error: BaseException) -> bool:
    """S3 unreachable, timing out, or failing on its side (5xx, SlowDown), as opposed to
    refusing the request (4xx)."""
    if isinstance(error, ConnectionError | HTTPClientError | OSError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(status or 0) >= 500 or _code(error) == "SlowDown"
    return False


@contextmanager
def _answering() -> Iterator[None]:
    """S3 not answering becomes StorageUnavailable, also when the call's deadline passes
    meanwhile; its refusals pass unchanged."""
    try:
        with deadlines.waiting_for(StorageUnavailable):
            yield
    except Exception as error:
        if _not_answering(error):
            raise StorageUnavailable() from error
        raise


class S3Storage:
    def __init__(
        self,
        settings: S3Settings,
        part_bytes: int = PART_BYTES,
        cache_control: str = object_cache_control(DEFAULT_OBJECT_MAX_AGE_SECONDS),
    ) -> None:
        """``cache_control``: stored with the objects media puts, and asked of S3 on every
        signed download (``response-cache-control``), so objects a client or a worker
        uploaded with a presigned PUT are served with it too."""
        self._settings = settings
        self._part_bytes = part_bytes
        self.cache_control = cache_control
        self._session = AioSession()
        self._exit = AsyncExitStack()
        self._opened: tuple[S3Client, S3Client] | None = None
        self._opening = asyncio.Lock()
        self.bucket = settings.bucket

    def _client_args(self, endpoint: str) -> dict[str, Any]:
        args: dict[str, Any] = {
            "region_name": self._settings.region,
            "config": AioConfig(
                signature_version="s3v4",
                s3={"addressing_style": "path" if self._settings.path_style else "auto"},
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=60,
            ),
        }
        if endpoint:
            args["endpoint_url"] = endpoint
        if self._settings.access_key_id:
            args["aws_access_key_id"] = self._settings.access_key_id
            args["aws_secret_access_key"] = self._settings.secret_access_key
        return args

    async def _clients(self) -> tuple[S3Client, S3Client]:
        """(the client for data, the client that signs URLs for clients to use)."""
        if self._opened is None:
            async with self._opening:
                if self._opened is None:
                    data = await self._exit.enter_async_context(
                        self._session.create_client(
                            "s3", **self._client_args(self._settings.endpoint_url)
                        )
                    )
                    signer = data
                    public = self._settings.public_endpoint_url
                    if public and public != self._settings.endpoint_url:
                        # Signing is local; the host clients will use is part of it.
                        signer = await self._exit.enter_async_context(
                            self._session.create_client("s3", **self._client_args(public))
                        )
                    # First, so that botocore's own choice (from the endpoint's auth
                    # scheme) does not answer before ours.
                    signer.meta.events.register_first(
                        "choose-signer.s3.GetObject", _choose_signed_as_of
                    )
                    self._opened = (data, signer)
        return self._opened

    async def put(self, key: str, chunks: AsyncIterable[bytes], content_type: str) -> None:
        client, _ = await self._clients()
        buffer = bytearray()
        upload_id: str | None = None
        parts: list[CompletedPartTypeDef] = []
        # A wait past the call's deadline here is the object store's, not the database's.
        with deadlines.waiting_for(StorageUnavailable):
            try:
                async for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        # Fill the part exactly; the rest of the chunk starts the next one.
                        room = self._part_bytes - len(buffer)
                        buffer += view[:room]
                        view = view[room:]
                        if len(buffer) < self._part_bytes:
                            break
                        if upload_id is None:
                            started = await client.create_multipart_upload(
                                Bucket=self.bucket,
                                Key=key,
                                ContentType=content_type,
                                CacheControl=self.cache_control,
                            )
                            upload_id = started["UploadId"]
                        # The full buffer itself is the part (no copy); a new one takes its place.
                        parts.append(await self._upload_part(client, key, upload_id, parts, buffer))
                        buffer = bytearray()
                if upload_id is None:
                    await client.put_object(
                        Bucket=self.bucket,
                        Key=key,
                        Body=_blob(buffer),
                        ContentType=content_type,
                        CacheControl=self.cache_control,
                        IfNoneMatch="*",
                    )
                    return
                if buffer:
                    parts.append(await self._upload_part(client, key, upload_id, parts, buffer))
                await client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    IfNoneMatch="*",
                )
            except ClientError as error:
                await self._abort(client, key, upload_id)
                if _code(error) in _TAKEN:
                    raise ObjectExists(key) from None
                if _not_answering(error):
                    raise StorageUnavailable() from error
                raise
            except (ConnectionError, HTTPClientError, OSError) as error:
                await self._abort(client, key, upload_id)
                raise StorageUnavailable() from error
            except BaseException:
                await self._abort(client, key, upload_id)
                raise

    async def _upload_part(
        self,
        client: S3Client,
        key: str,
        upload_id: str,
        parts: list[CompletedPartTypeDef],
        data: bytearray,
    ) -> CompletedPartTypeDef:
        number = len(parts) + 1
        uploaded = await client.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=_blob(data)
        )
        return {"PartNumber": number, "ETag": uploaded["ETag"]}

    async def _abort(self, client: S3Client, key: str, upload_id: str | None) -> None:
        """Best effort, shielded from cancellation (an abandoned multipart upload keeps
        costing storage; a bucket lifecycle rule is the backstop); never hides the error
        that made us abort."""
        if upload_id is None:
            return
        try:
            await asyncio.shield(
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            )
        except Exception:
            log.warning("multipart_abort_failed", key=key)

    async def stream(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        client, _ = await self._clients()
        try:
            with _answering():
                response = await client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if _code(error) in _MISSING:
                raise ObjectNotFound(key) from None
            raise
        with _answering():
            async for chunk in _even_chunks(response["Body"], chunk_bytes):
                yield chunk

    async def stat(self, key: str) -> ObjectStat | None:
        client, _ = await self._clients()
        try:
            with _answering():
                head = await client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as error:
            if _code(error) in _MISSING:
                return None
            raise
        checksum = head.get("ChecksumSHA256")
        return ObjectStat(
            size_bytes=head["ContentLength"],
            content_type=head.get("ContentType"),
            sha256=None if not checksum else base64.b64decode(checksum).hex(),
        )

    async def read_head(self, key: str, max_bytes: int) -> bytes:
        client, _ = await self._clients()
        try:
            with _answering():
                response = await client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes=0-{max_bytes - 1}"
                )
                async with response["Body"] as body:
                    return bytes(await body.read())
        except ClientError as error:
            if _code(error) in _MISSING:
                raise ObjectNotFound(key) from None
            if _code(error) == "InvalidRange":  # an empty object has no byte 0
                return b""
            raise

    async def delete(self, key: str) -> None:
        client, _ = await self._clients()
        with _answering():
            await client.delete_object(Bucket=self.bucket, Key=key)

    async def remove_abandoned_writes(self, older_than: datetime, limit: int) -> int:
        """Aborts up to ``limit`` multipart uploads started before ``older_than`` (a
        crashed PutAsset's; a bucket lifecycle rule is the backstop)."""
        client, _ = await self._clients()
        aborted = 0
        key_marker = upload_marker = ""
        with _answering():
            while aborted < limit:
                page = await client.list_multipart_uploads(
                    Bucket=self.bucket,
                    MaxUploads=limit,
                    KeyMarker=key_marker,
                    UploadIdMarker=upload_marker,
                )
                for upload in page.get("Uploads", []):
                    if aborted < limit and upload["Initiated"] < older_than:
                        try:
                            await client.abort_multipart_upload(
                                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                            )
                        except ClientError as error:
                            if _code(error) != "NoSuchUpload":  # another replica's, already
                                raise
                            continue
                        aborted += 1
                if not page.get("IsTruncated"):
                    break
                key_marker = page.get("NextKeyMarker", "")
                upload_marker = page.get("NextUploadIdMarker", "")
        return aborted

    async def presign_put(
        self,
        key: str,
        content_type: str,
        size_bytes: int,
        expires_at: datetime,
        sha256: str | None = None,
    ) -> SignedRequest:
        _, signer = await self._clients()
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "ContentType": content_type,
            "ContentLength": size_bytes,
            "IfNoneMatch": "*",
        }
        headers = {
            "Content-Type": content_type,
            "Content-Length": str(size_bytes),
            "If-None-Match": "*",
        }
        if sha256 is not None:
            # Signed: S3 refuses (BadDigest) a body whose SHA-256 is not this one.
            checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
            params["ChecksumSHA256"] = checksum
            headers["x-amz-checksum-sha256"] = checksum
        url = await signer.generate_presigned_url(
            "put_object", Params=params, ExpiresIn=_seconds_until(expires_at)
        )
        return SignedRequest("PUT", url, headers)

    async def presign_get(
        self,
        key: str,
        content_type: str,
        expires_at: datetime,
        signed_at: datetime | None = None,
    ) -> SignedRequest:
        _, signer = await self._clients()
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentType": content_type,
            "ResponseCacheControl": self.cache_control,
        }
        if signed_at is None:
            url = await signer.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=_seconds_until(expires_at)
            )
            return SignedRequest("GET", url)
        # X-Amz-Date is the window's start and X-Amz-Expires runs from it to the expiry:
        # S3 accepts the URL from then until expires_at, and every read in the window
        # gets these very bytes.
        lifetime = math.floor((expires_at - signed_at).total_seconds())
        moment = _SIGNING_TIME.set(signed_at.replace(microsecond=0))
        try:
            url = await signer.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=lifetime
            )
        finally:
            _SIGNING_TIME.reset(moment)
        return SignedRequest("GET", url)

    async def close(self) -> None:
        self._opened = None
        await self._exit.aclose()


async def _even_chunks(stream: Any, chunk_bytes: int) -> AsyncIterator[bytes]:
    """The network hands over whatever arrived; callers get even chunks."""
    async with stream as body:
        buffer = bytearray()
        while piece := await body.read(chunk_bytes - len(buffer)):
            buffer += piece
            if len(buffer) >= chunk_bytes:
                yield bytes(buffer)
                buffer.clear()
        if buffer:
            yield bytes(buffer)


def _blob(data: bytearray) -> bytes:
    """botocore takes a bytearray as a body as it is (the stubs say bytes): no copy."""
    return cast(bytes, data)


def _seconds_until(moment: datetime) -> int:
    return max(1, math.floor((moment - datetime.now(UTC)).total_seconds()))
