"""A real HTTP webhook receiver for tests: a threaded HTTP/1.1 server (keep-alive) on
127.0.0.1 that verifies EVERY delivery with the reference ``standardwebhooks`` package
(never our own signing code), against each secret it holds, and records what came.

Its answers are steered by the test: a status (and Retry-After), a delay, a redirect; it
can be stopped and started again on the same port (an endpoint that is down)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass(frozen=True)
class Received:
    webhook_id: str
    timestamp: str
    signature: str
    body: dict[str, Any]
    # The secrets (by index in the receiver's list) that verified it.
    verified_by: tuple[int, ...]
    status: int
    at: float

    @property
    def version(self) -> int:
        return int(self.body["data"]["version"])

    @property
    def job_id(self) -> str:
        return str(self.body["data"].get("jobId", ""))


@dataclass
class Answer:
    status: int = 204
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class WebhookReceiver:
    def __init__(
        self, secrets: list[str], port: int = 0, tls: tuple[Path, Path] | None = None
    ) -> None:
        """``tls``: a certificate and its key to serve https with (for ``localhost``)."""
        self.secrets = list(secrets)
        self._tls = tls
        self.received: list[Received] = []
        self.unverified: list[str] = []
        # What the next request gets (called with the request's webhook-id).
        self.answer: Callable[[str], Answer] = lambda _id: Answer()
        # Requests being answered now, and the most there ever were at once.
        self.in_flight = 0
        self.most_in_flight = 0
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        if self._tls is not None:
            return f"https://localhost:{self.port}/hooks"
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                data = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._changed:
                    receiver.in_flight += 1
                    receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                answer = receiver.answer(headers.get("webhook-id", ""))
                if answer.delay:
                    time.sleep(answer.delay)
                with receiver._changed:
                    receiver.in_flight -= 1
                receiver._take(data, headers, answer.status)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self._tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self._tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _take(self, data: bytes, headers: dict[str, str], status: int) -> None:
        verified = []
        for index, secret in enumerate(self.secrets):
            try:
                Webhook(secret).verify(data, headers)
            except WebhookVerificationError:
                continue
            verified.append(index)
        with self._changed:
            if not verified:
                self.unverified.append(headers.get("webhook-id", ""))
            else:
                self.received.append(
                    Received(
                        headers["webhook-id"],
                        headers["webhook-timestamp"],
                        headers["webhook-signature"],
                        json.loads(data),
                        tuple(verified),
                        status,
                        time.monotonic(),
                    )
                )
            self._changed.notify_all()

    def accepted(self) -> list[Received]:
        """The deliveries it answered 2xx to."""
        with self._changed:
            return [r for r in self.received if 200 <= r.status < 300]

    async def wait_until(self, condition: Callable[[WebhookReceiver], bool], within: float) -> None:
        """Returns once ``condition(self)`` holds (checked at every delivery); fails the
        test after ``within`` seconds."""

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: condition(self), within)

        if not await asyncio.to_thread(wait):
            raise AssertionError(
                f"the receiver's condition did not hold within {within:g} s"
                f" ({len(self.received)} received, {len(self.unverified)} unverified)"
            )
