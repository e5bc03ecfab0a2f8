"""media's plain-HTTP listener for the local backend's signed URLs: PUT to upload, GET
(and HEAD) to download. It serves a signed request only: the signature must verify, the
URL must not have expired, an upload must carry the signed content type and a declared
length within the signed size, and an object that exists is never replaced.

With the asset rows at hand (always, in the service), a URL works only while its asset
allows it: an upload while the asset is uploading, a download while it is ready. So a
deleted asset's URLs stop working at once, and bytes PUT while the asset was being
deleted are removed again.

Every refusal is a JSON ``google.rpc.Status`` with a stable reason
(:mod:`services.media.http_answers`); a dependency that does not answer is 503 with
``Retry-After``, never a 500.

The socket is bound when the server is built, before the gRPC listeners report SERVING,
so a client that was handed a URL can always connect.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import Counter

from services.kit.logging import get_logger
from services.kit.sizes import byte_size
from services.media.domain import KEY_PATTERN, Status, owning_object_key
from services.media.errors import MediaError, Reason
from services.media.http_answers import (
    ObjectServer,
    Refused,
    answer,
    failure_answer,
    internal_answer,
)
from services.media.storage.base import ObjectExists, WholeObject
from services.media.storage.local import LocalStorage
from services.media.storage.signing import OBJECTS_PATH, Verdict

log = get_logger(__name__)
# Counted; its line is DEBUG: the asset's completion checks the object and records it.
OBJECTS_UPLOADED = Counter(
    "atelier_media_objects_uploaded",
    "Objects the local backend's HTTP listener stored from a signed PUT",
)

READ_BYTES = 256 * 1024
_SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff"}
# What we sign: an expiry in epoch seconds, a size in bytes. Nothing longer is ours.
_SIGNED_NUMBER = re.compile(r"[0-9]{1,15}")
_SIGNED_SHA256 = re.compile(r"[0-9a-f]{64}")
# A read that asks for part of an object, or for it only if changed, is the file
# response's to answer (ranges, validators).
_CONDITIONAL_HEADERS = (
    "Range",
    "If-Range",
    "If-Match",
    "If-None-Match",
    "If-Modified-Since",
    "If-Unmodified-Since",
)
# What _small_file answers for an object larger than it reads whole.
_LARGE = b"(larger)"


class AssetRows(Protocol):
    async def status_by_key(self, object_key: str) -> Status | None: ...


class IncompleteBody(Exception):
    """The client sent fewer bytes than it declared."""


class OtherBytes(Exception):
    """The body's SHA-256 is not the one the upload URL was signed for."""


def _single(request: web.BaseRequest, name: str) -> str:
    """The one value of a query parameter ("" when absent). A signed parameter given twice
    is not the URL we signed, whichever copy a proxy would pick."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise Refused(403, Reason.SIGNATURE_MISMATCH, f"{name} is given more than once")
    return values[0] if values else ""


def _signed_number(request: web.BaseRequest, name: str, missing: str) -> int:
    text = _single(request, name)
    if not text:
        raise Refused(403, Reason.SIGNATURE_MISSING, missing)
    if not _SIGNED_NUMBER.fullmatch(text):
        raise Refused(403, Reason.SIGNATURE_MISMATCH, f"{name} is not what was signed")
    return int(text)


def _object_key(request: web.BaseRequest) -> str:
    key = request.path.removeprefix(OBJECTS_PATH)
    if not request.path.startswith(OBJECTS_PATH) or not KEY_PATTERN.fullmatch(key):
        raise Refused(404, Reason.NO_SUCH_OBJECT, "no such object")
    return key


class ObjectHttpServer:
    def __init__(
        self,
        storage: LocalStorage,
        host: str,
        port: int,
        clock: Callable[[], float] = time.time,
        rows: AssetRows | None = None,
    ) -> None:
        """``rows`` ties each URL to its asset's state; only the storage layer's own tests
        go without (they have no assets)."""
        self._storage = storage
        self._clock = clock
        self._rows = rows
        self._socket = socket.create_server((host, port), backlog=256)
        self.port: int = self._socket.getsockname()[1]

    async def serve_objects(self) -> None:
        """Serves until cancelled. No access log: URLs carry signatures."""
        runner = web.ServerRunner(ObjectServer(self._handle, access_log=None))
        await runner.setup()
        try:
            await web.SockSite(runner, self._socket).start()
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            self._socket.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every answer that is not the object is a JSON google.rpc.Status."""
        try:
            if request.method == "PUT":
                return await self._put(request)
            if request.method in ("GET", "HEAD"):
                return await self._get(request)
            raise Refused(405, Reason.METHOD_NOT_ALLOWED, "PUT uploads, GET downloads")
        except Refused as refused:
            allow = {"Allow": "GET, HEAD, PUT"} if refused.status == 405 else None
            return answer(refused.status, refused.error, allow)
        except MediaError as failure:
            return failure_answer(failure)
        except Exception:
            log.exception("object_request_failed", method=request.method)
            return internal_answer()

    def _check(
        self,
        request: web.BaseRequest,
        method: str,
        key: str,
        content_type: str,
        size: int | None,
        sha256: str | None = None,
    ) -> None:
        """Returns when the request is signed for exactly this; else raises Refused."""
        missing = "the URL is not a signed media URL"
        signature = _single(request, "signature")
        expires = _signed_number(request, "expires", missing)
        if not signature:
            raise Refused(403, Reason.SIGNATURE_MISSING, missing)
        verdict = self._storage.signer.verify(
            method,
            key,
            expires=expires,
            content_type=content_type,
            size=size,
            signature=signature,
            now=self._clock(),
            sha256=sha256,
        )
        if verdict is Verdict.BAD_SIGNATURE:
            raise Refused(403, Reason.SIGNATURE_MISMATCH, _mismatch(method, content_type))
        if verdict is Verdict.EXPIRED:
            raise Refused(403, Reason.URL_EXPIRED, "the URL has expired")

    async def _put(self, request: web.BaseRequest) -> web.StreamResponse:
        key = _object_key(request)
        signed_size = _signed_number(request, "size", "the URL is not a signed upload URL")
        sha256 = _signed_sha256(request)
        content_type = request.headers.get("Content-Type", "")
        self._check(request, "PUT", key, content_type, signed_size, sha256)
        # The asset's state is read once, after the write (_kept_if_wanted): an object
        # never replaces another (a ready asset's PUT meets ObjectExists), and bytes its
        # asset no longer wants are removed there, before any answer.
        length = request.content_length
        if length is None:
            raise Refused(411, Reason.LENGTH_REQUIRED, "send Content-Length")
        if length > signed_size:
            raise Refused(
                413, Reason.TOO_LARGE, f"at most {byte_size(signed_size)} may be uploaded"
            )
        try:
            if length <= READ_BYTES:
                # A small object (a generated output, most often): read whole, then
                # written, made durable and published in one trip to a thread, not one
                # trip per step.
                body: AsyncIterable[bytes] = WholeObject(
                    await _whole_body(request, length, sha256), READ_BYTES
                )
            else:
                body = _body(request, length, sha256)
            await self._storage.put(key, body, content_type)
        except OtherBytes:
            raise Refused(
                400, Reason.HASH_MISMATCH, "the bytes' SHA-256 differs from the declared sha256"
            ) from None
        except ObjectExists:
            raise Refused(412, Reason.OBJECT_EXISTS, "the object was already uploaded") from None
        except (IncompleteBody, ConnectionError):
            raise Refused(
                400, Reason.INCOMPLETE_BODY, "fewer bytes arrived than Content-Length"
            ) from None
        await self._kept_if_wanted(key)
        OBJECTS_UPLOADED.inc()
        log.debug("object_uploaded", size_bytes=length)
        return web.Response(status=200)

    async def _kept_if_wanted(self, key: str) -> None:
        """The object stays only while its asset is uploading (or was completed since):
        an asset deleted before or while its bytes arrived must not get them back (its
        deletion removed the object before ours appeared), so ours goes, and so it does
        when the asset's state cannot be read now (503: the client sends it again)."""
        if self._rows is None:
            return
        try:
            status = await self._rows.status_by_key(key)
        except MediaError:
            await self._storage.delete(key)
            raise
        if status is not Status.UPLOADING and status is not Status.READY:
            await self._storage.delete(key)
            log.info("object_upload_discarded")
            raise _gone(status)

    async def _get(self, request: web.BaseRequest) -> web.StreamResponse:
        key = _object_key(request)
        content_type = _single(request, "type")
        self._check(request, "GET", key, content_type, None)
        if self._rows is not None:
            # A thumbnail is served while its asset is.
            status = await self._rows.status_by_key(owning_object_key(key))
            if status is not Status.READY:
                raise _gone(status)
        path = self._storage.file_of(key)
        # How long a browser may keep it: the storage's Cache-Control (an object never
        # changes under its key, so as long as its URL can work, and immutable).
        headers = {
            "Content-Type": content_type,
            "Cache-Control": self._storage.cache_control,
            **_SECURITY_HEADERS,
        }
        if not any(name in request.headers for name in _CONDITIONAL_HEADERS):
            # A plain read of a small object (a job's input, a thumbnail): opened, read
            # and closed on the loop, from the page cache as a rule (microseconds, less
            # than a trip to a thread and back); a larger one is served from its file.
            small = _small_file(path, READ_BYTES)
            if small is None:
                raise Refused(404, Reason.NO_SUCH_OBJECT, "no such object")
            if small is not _LARGE:
                return web.Response(body=small, headers=headers)
        elif not os.path.isfile(path):  # noqa: ASYNC240 - one stat, on the loop (storage.local)
            raise Refused(404, Reason.NO_SUCH_OBJECT, "no such object")
        return web.FileResponse(path, headers=headers)


def _mismatch(method: str, content_type: str) -> str:
    """What a refused signature tells the client to change. An upload is signed for its
    Content-Type, so the likeliest mistake is a PUT that sends another one (or none): say
    which one arrived, and that uploadHeaders must be sent as the upload answer gave them."""
    if method != "PUT":
        return "the signature does not match this request: use the URL exactly as given"
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    return (
        "the signature does not match this request: send the PUT to uploadUrl unchanged,"
        " with every header of uploadHeaders exactly as the upload answer gave it (this"
        f" request had {sent})"
    )


def _gone(status: Status | None) -> Refused:
    if status is Status.DELETED:
        return Refused(404, Reason.ASSET_DELETED, "the asset was deleted")
    return Refused(404, Reason.NO_SUCH_OBJECT, "no such object")


def _signed_sha256(request: web.BaseRequest) -> str | None:
    """The hash an upload URL was signed with (None: it was signed without one)."""
    text = _single(request, "sha256")
    if not text:
        return None
    if not _SIGNED_SHA256.fullmatch(text):
        raise Refused(403, Reason.SIGNATURE_MISMATCH, "sha256 is not what was signed")
    return text


def _small_file(path: str, max_bytes: int) -> bytes | None:
    """The whole object when it has at most ``max_bytes`` (None: no such object;
    ``_LARGE``: larger). Blocking."""
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None
    return data if len(data) <= max_bytes else _LARGE


async def _whole_body(request: web.BaseRequest, length: int, sha256: str | None) -> bytes:
    """The body of ``length`` bytes, checked as _body checks it, in memory."""
    try:
        data = await request.content.readexactly(length)
    except asyncio.IncompleteReadError:
        raise IncompleteBody() from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise OtherBytes()
    return data


async def _body(request: web.BaseRequest, length: int, sha256: str | None) -> AsyncIterator[bytes]:
    """The body as it arrives; with ``sha256``, hashed on the way. A mismatch raises
    after the last chunk, before the storage publishes the object (it writes to a
    temporary file and discards it when this raises): other bytes never appear under
    the key."""
    received = 0
    digest = hashlib.sha256() if sha256 is not None else None
    async for chunk in request.content.iter_chunked(READ_BYTES):
        received += len(chunk)
        if digest is not None:
            digest.update(chunk)
        yield chunk
    if received != length:
        raise IncompleteBody()
    if digest is not None and digest.hexdigest() != sha256:
        raise OtherBytes()
