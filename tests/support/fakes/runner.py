"""Runs a fake vendor's aiohttp application on a loop of its own, in a thread of the test
process or as a subprocess.

In a thread the fake keeps answering while the test's own loop is busy or blocked (a
worker subprocess polling it does not care which), and its scripting methods are plain
calls guarded by the fake's lock. As a subprocess (``python -m
tests.support.fakes.replicate_api`` / ``fal_api``) it prints one JSON line
``{"url": ...}`` once listening and takes its script over ``POST /_fake/control``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from collections.abc import Callable

from aiohttp import web


class ThreadedServer:
    """An aiohttp application served on 127.0.0.1 from a daemon thread."""

    def __init__(self, make_app: Callable[[], web.Application], port: int = 0) -> None:
        self._make_app = make_app
        self._port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.url = ""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "server not started"
        return self._loop

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="fake-vendor", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=15):
            raise RuntimeError("fake vendor did not start within 15 s")
        if self._error is not None:
            raise RuntimeError("fake vendor failed to start") from self._error
        return self.url

    def stop(self) -> None:
        if self._loop is None or self._stop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=15)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            runner, port = await start_app(self._make_app(), self._port)
        except BaseException as error:  # reported to start()
            self._error = error
            self._ready.set()
            return
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


async def start_app(app: web.Application, port: int = 0) -> tuple[web.AppRunner, int]:
    # handler_cancellation: a client that hangs up mid-request (a worker killed while it
    # waits on ``Prefer: wait``) ends that handler instead of leaving it running.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    bound = server.sockets[0].getsockname()[1]
    return runner, int(bound)


def serve_main(make_app: Callable[[argparse.Namespace], web.Application], description: str) -> None:
    """The subprocess entry point shared by the fakes: ``--port``, ``--token`` and the
    fake-specific options are parsed by the caller's ``make_app``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", required=True, help="the API key the fake accepts")
    parser.add_argument("--tag-header", default=None, help="request header that names the client")
    arguments = parser.parse_args()

    async def main() -> None:
        runner, port = await start_app(make_app(arguments), arguments.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, stop.set)
        sys.stdout.write(json.dumps({"url": f"http://127.0.0.1:{port}"}) + "\n")
        sys.stdout.flush()
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


class FileHost:
    """Serves fixed files over HTTP from a thread: the input photo behind a URL, the way
    media's signed URLs hand it to a provider. ``refuse`` answers a path with a status (an
    expired signed URL answers 403)."""

    def __init__(self, files: dict[str, tuple[bytes, str]]) -> None:
        self.files = dict(files)
        self.refuse: dict[str, int] = {}
        self.fetches: list[str] = []
        self._server = ThreadedServer(self._make_app)
        self.url = ""

    def _make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name:.+}", self._serve)
        return app

    async def _serve(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.fetches.append(name)
        if name in self.refuse:
            return web.Response(status=self.refuse[name], text="refused")
        if name not in self.files:
            return web.Response(status=404, text="Not Found")
        data, content_type = self.files[name]
        return web.Response(body=data, content_type=content_type)

    def __enter__(self) -> FileHost:
        self.url = self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
