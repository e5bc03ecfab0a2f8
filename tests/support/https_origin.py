"""A real HTTPS server on 127.0.0.1 for tests of server-side fetches (media's
ImportAsset): a self-signed certificate (for 127.0.0.1, localhost and photos.test) that a
test trusts through a setting, and answers a test sets per path."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.support.certificates import self_signed_for

NAMES = ("localhost", "photos.test")


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds to wait before answering.
    delay: float = 0.0
    # Send the body without a Content-Length (chunked).
    chunked: bool = False


@dataclass
class Origin:
    port: int
    ca_file: Path
    answers: dict[str, Answer]
    # Paths asked for, in order.
    hits: list[str]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"

    def serve(self, path: str, answer: Answer) -> str:
        self.answers[path] = answer
        return self.url(path)

    def image(self, path: str, data: bytes, content_type: str = "image/png") -> str:
        return self.serve(path, Answer(body=data, headers={"Content-Type": content_type}))

    def redirect(self, path: str, location: str, status: int = 302) -> str:
        return self.serve(path, Answer(status=status, headers={"Location": location}))


@asynccontextmanager
async def https_origin(directory: Path) -> AsyncIterator[Origin]:
    cert, key = self_signed_for(directory, NAMES, ("127.0.0.1",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    answers: dict[str, Answer] = {}
    hits: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        hits.append(request.path_qs)
        answer = answers.get(request.path_qs) or answers.get(request.path)
        if answer is None:
            return web.Response(status=404, text="no such test answer")
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if answer.chunked:
            response = web.StreamResponse(status=answer.status, headers=answer.headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
            for start in range(0, len(answer.body), 16 * 1024):
                await response.write(answer.body[start : start + 16 * 1024])
            await response.write_eof()
            return response
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Origin(port, cert, answers, hits)
    finally:
        await runner.cleanup()
