"""Anchors for the benchmarks: what the machine does with no atelier code in the way.

A figure of ours means little on a shared 2-vCPU machine unless it is measured beside
the same work done the plainest possible way, in the same run. The echo anchor is a bare
grpc.aio server in its own process (as each service is) answering a unary call with the
bytes it got: the floor under any RPC of ours. The HTTP echo anchor is a bare asyncio
HTTP/1.1 server in its own process answering every request with a small JSON body: the
floor under a JSON call's client side, measured through the same client as the JSON calls.

:class:`Http1Client` is that client: one keep-alive HTTP/1.1 connection, each request
written in one send, the response read by Content-Length (or chunks). Like grpc.aio's
C-core client it does little per call in Python; aiohttp's pure-asyncio request path costs
several times more CPU per call here (the benches print both on the HTTP echo), which the
JSON path alone would pay in a JSON-versus-gRPC comparison.

    .venv/bin/python bench/anchors.py echo-server --port 50999        # used by the benches
    .venv/bin/python bench/anchors.py http-echo-server --port 50998   # used by the benches
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from services.dev.processes import free_port

ECHO_METHOD = "/bench.Echo/Call"
HTTP_ECHO_BODY = b'{"ok":true}'


async def _serve_echo(port: int) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


class _HttpEcho(asyncio.Protocol):
    """Answers each HTTP/1.1 request (Content-Length bodies) with HTTP_ECHO_BODY."""

    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(HTTP_ECHO_BODY), HTTP_ECHO_BODY)
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        self.pending += data
        while (end := self.pending.find(b"\r\n\r\n")) >= 0:
            length = _content_length(self.pending[:end].split(b"\r\n")[1:])
            if len(self.pending) < end + 4 + length:
                return
            self.pending = self.pending[end + 4 + length :]
            self.transport.write(self.answer)


def _content_length(header_lines: list[bytes]) -> int:
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def _serve_http_echo(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_HttpEcho, "127.0.0.1", port)
    await server.serve_forever()


class HttpError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status


class Http1Client:
    """One keep-alive HTTP/1.1 connection to ``host:port``, one request at a time
    (opened on first use, closed by :meth:`close`). A status other than 2xx raises
    :class:`HttpError`."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> bytes:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        lines.append(f"content-length: {len(body)}")
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = (await self._reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(head[0].split()[1])
        if any(line.lower().startswith(b"transfer-encoding:") for line in head[1:]):
            answer = await self._read_chunks(self._reader)
        else:
            answer = await self._reader.readexactly(_content_length(head[1:]))
        if not 200 <= status < 300:
            raise HttpError(status, answer)
        return answer

    @staticmethod
    async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        await reader.readuntil(b"\r\n")  # the empty trailer section
        return b"".join(parts)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._reader = self._writer = None


@contextlib.contextmanager
def http_echo_server() -> Iterator[tuple[str, int]]:
    """A bare asyncio HTTP/1.1 echo server in its own process; yields (host, port)."""
    with _child("http-echo-server") as port:
        yield "127.0.0.1", port


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """A bare grpc.aio echo server in its own process; yields its address."""
    with _child("echo-server") as port:
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def _child(role: str) -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), role, "--port", str(port)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the echo server did not start")
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def echo_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(ECHO_METHOD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["echo-server", "http-echo-server"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        serve = _serve_echo if args.role == "echo-server" else _serve_http_echo
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
