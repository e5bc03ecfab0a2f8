"""media's plain-HTTP listener for the local backend's signed URLs: PUT to upload, GET
(and HEAD) to download. It serves a signed request only: the signature must verify, the
URL must not have expired, an upload must carry the signed content type and a declared
length within the signed size, and an object that exists is never replaced.

The socket is bound when the server is built, before the gRPC listeners report SERVING,
so a client that was handed a URL can always connect.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from services.kit.logging import get_logger
from services.media.model import KEY_PATTERN
from services.media.storage.base import ObjectExists
from services.media.storage.local import LocalStorage
from services.media.storage.signing import OBJECTS_PATH, Verdict

log = get_logger(__name__)

READ_BYTES = 256 * 1024
# How long a browser or proxy may keep a downloaded object: it never changes.
_SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=300"}


class IncompleteBody(Exception):
    """The client sent fewer bytes than it declared."""


def _refuse(status: int, error: str, message: str) -> web.Response:
    log.info("object_request_refused", status=status, error=error)
    return web.json_response({"error": error, "message": message}, status=status)


def _signed_int(query: dict[str, str], name: str) -> int | None:
    try:
        return int(query[name])
    except (KeyError, ValueError):
        return None


class ObjectHttpServer:
    def __init__(
        self,
        storage: LocalStorage,
        host: str,
        port: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._socket = socket.create_server((host, port), backlog=256)
        self.port: int = self._socket.getsockname()[1]

    def application(self) -> web.Application:
        app = web.Application()
        path = OBJECTS_PATH + "{key:.+}"
        app.router.add_route("PUT", path, self._put)
        app.router.add_get(path, self._get)  # HEAD too
        return app

    async def serve_objects(self) -> None:
        """Serves until cancelled. No access log: URLs carry signatures."""
        runner = web.AppRunner(self.application(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.SockSite(runner, self._socket).start()
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            self._socket.close()

    def _check(
        self, request: web.Request, method: str, content_type: str, size: int | None
    ) -> web.Response | None:
        """None when the request is signed for exactly this; else the refusal."""
        key = request.match_info["key"]
        query = dict(request.query)
        expires = _signed_int(query, "expires")
        signature = query.get("signature", "")
        if expires is None or not signature:
            return _refuse(403, "SIGNATURE_MISSING", "the URL is not a signed media URL")
        verdict = self._storage.signer.verify(
            method,
            key,
            expires=expires,
            content_type=content_type,
            size=size,
            signature=signature,
            now=self._clock(),
        )
        if verdict is Verdict.BAD_SIGNATURE:
            return _refuse(
                403,
                "SIGNATURE_MISMATCH",
                "the signature does not match this request (URL, method or headers changed)",
            )
        if verdict is Verdict.EXPIRED:
            return _refuse(403, "URL_EXPIRED", "the URL has expired")
        return None

    async def _put(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        if not KEY_PATTERN.fullmatch(key):
            return _refuse(404, "NO_SUCH_OBJECT", "no such object")
        signed_size = _signed_int(dict(request.query), "size")
        if signed_size is None:
            return _refuse(403, "SIGNATURE_MISSING", "the URL is not a signed upload URL")
        content_type = request.headers.get("Content-Type", "")
        refusal = self._check(request, "PUT", content_type, signed_size)
        if refusal is not None:
            return refusal
        length = request.content_length
        if length is None:
            return _refuse(411, "LENGTH_REQUIRED", "send Content-Length")
        if length > signed_size:
            return _refuse(413, "TOO_LARGE", f"at most {signed_size} bytes may be uploaded")
        try:
            await self._storage.put(key, _body(request, length), content_type)
        except ObjectExists:
            return _refuse(412, "OBJECT_EXISTS", "the object was already uploaded")
        except IncompleteBody:
            return _refuse(400, "INCOMPLETE_BODY", "fewer bytes arrived than Content-Length")
        log.info("object_uploaded", size_bytes=length)
        return web.Response(status=200)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        if not KEY_PATTERN.fullmatch(key):
            return _refuse(404, "NO_SUCH_OBJECT", "no such object")
        content_type = request.query.get("type", "")
        refusal = self._check(request, "GET", content_type, None)
        if refusal is not None:
            return refusal
        path = self._storage.path_of(key)
        if not await asyncio.to_thread(path.is_file):
            return _refuse(404, "NO_SUCH_OBJECT", "no such object")
        return web.FileResponse(path, headers={"Content-Type": content_type, **_SECURITY_HEADERS})


async def _body(request: web.Request, length: int) -> AsyncIterator[bytes]:
    received = 0
    async for chunk in request.content.iter_chunked(READ_BYTES):
        received += len(chunk)
        yield chunk
    if received != length:
        raise IncompleteBody()
