"""A small HTTP/2 client over asyncio and h2: one TLS connection per origin, many
concurrent streams on it, nothing more than APNs needs (POST a small body, read status,
headers and a small body). httpx over h2 spent about a millisecond of CPU per request,
which capped one sender near 600 pushes/s; this spends a fraction of that."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error


class ConnectionLost(Exception):
    """The connection closed (or was refused) before the stream's answer came."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    # Which connection answered (numbered per client): what Http2Client.retire takes.
    connection: int = 0


@dataclass
class _Stream:
    done: asyncio.Future[Response]
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


class _Http2Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        # Set whenever a stream slot or flow-control window may have opened.
        self._room = asyncio.Event()
        self._ready = asyncio.get_running_loop().create_future()
        self.closed = False
        # Retired: takes no new streams and closes once its last one has ended.
        self.retired = False
        self.number = 0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always a subclass of asyncio.Transport (uvloop's
        # TLS transport implements the interface without inheriting it).
        self._transport = cast(asyncio.Transport, transport)
        self._h2.initiate_connection()
        self._transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except H2Error as error:
            self._fail_all(ConnectionLost(f"protocol error: {type(error).__name__}"))
            self._close()
            return
        for event in events:
            self._handle(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail_all(ConnectionLost("connection closed"))

    # -- requests ----------------------------------------------------------------------------

    async def ready(self) -> None:
        await self._ready

    async def request(
        self, headers: Sequence[tuple[str, str]], body: bytes, within_seconds: float
    ) -> Response:
        async with asyncio.timeout(within_seconds):
            while self._h2.open_outbound_streams >= self._h2.remote_settings.max_concurrent_streams:
                await self._wait_for_room()
            stream_id = self._h2.get_next_available_stream_id()
            stream = _Stream(asyncio.get_running_loop().create_future())
            self._streams[stream_id] = stream
            try:
                self._h2.send_headers(stream_id, headers, end_stream=not body)
                sent = 0
                while sent < len(body):
                    window = min(
                        self._h2.local_flow_control_window(stream_id),
                        self._h2.max_outbound_frame_size,
                    )
                    if window <= 0:
                        self._flush()
                        await self._wait_for_room()
                        continue
                    chunk = body[sent : sent + window]
                    sent += len(chunk)
                    self._h2.send_data(stream_id, chunk, end_stream=sent == len(body))
                self._flush()
                return await stream.done
            except BaseException:
                if self._streams.pop(stream_id, None) is not None and not self.closed:
                    # Abandoned (timeout, cancellation): tell the server to stop too.
                    try:
                        self._h2.reset_stream(stream_id)
                        self._flush()
                    except H2Error:
                        pass
                    self.close_if_idle()
                raise

    async def _wait_for_room(self) -> None:
        if self.closed:
            raise ConnectionLost("connection closed")
        self._room.clear()
        await self._room.wait()
        if self.closed:
            raise ConnectionLost("connection closed")

    def close_if_idle(self) -> None:
        if self.retired and not self._streams:
            self.close()

    def close(self) -> None:
        if not self.closed:
            try:
                self._h2.close_connection()
                self._flush()
            except H2Error:
                pass
        self._close()

    # -- internals -----------------------------------------------------------------------------

    def _handle(self, event: object) -> None:
        if isinstance(event, ResponseReceived):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                headers = {str(k): str(v) for k, v in event.headers or []}
                stream.status = int(headers.pop(":status", "0"))
                stream.headers = headers
        elif isinstance(event, DataReceived):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream.body.extend(event.data or b"")
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, StreamEnded):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None and not stream.done.done():
                stream.done.set_result(
                    Response(stream.status, stream.headers, bytes(stream.body), self.number)
                )
            self._room.set()
            self.close_if_idle()
        elif isinstance(event, StreamReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None and not stream.done.done():
                stream.done.set_exception(ConnectionLost(f"stream reset ({event.error_code})"))
            self._room.set()
            self.close_if_idle()
        elif isinstance(event, ConnectionTerminated):
            # GOAWAY: no new streams here; those the server did not take are failed.
            self.closed = True
            self._fail_all(ConnectionLost("server sent GOAWAY"))
            self._close()
        elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
            self._room.set()
        elif isinstance(event, SettingsAcknowledged) and not self._ready.done():
            self._ready.set_result(None)
        if isinstance(event, RemoteSettingsChanged) and not self._ready.done():
            self._ready.set_result(None)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _fail_all(self, error: Exception) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            if not stream.done.done():
                stream.done.set_exception(error)
        if not self._ready.done():
            self._ready.set_exception(error)
        self._room.set()

    def _close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Http2Client:
    """Connections by origin, opened on first use and again after one closes."""

    def __init__(self, tls: ssl.SSLContext, connect_timeout: float) -> None:
        tls.set_alpn_protocols(["h2"])
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._connections: dict[str, _Http2Connection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._opened = 0
        # Retired connections still finishing their streams (closed by close() too).
        self._retired: list[_Http2Connection] = []

    async def post(
        self, url: str, headers: Sequence[tuple[str, str]], body: bytes, within_seconds: float
    ) -> Response:
        parts = urlsplit(url)
        origin = f"{parts.hostname}:{parts.port or 443}"
        connection = await self._connection(origin, parts.hostname or "", parts.port or 443)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        request = [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", parts.netloc),
            (":path", path),
            *headers,
            ("content-length", str(len(body))),
        ]
        return await connection.request(request, body, within_seconds)

    async def _connection(self, origin: str, host: str, port: int) -> _Http2Connection:
        connection = self._connections.get(origin)
        if connection is not None and not connection.closed:
            return connection
        lock = self._connecting.setdefault(origin, asyncio.Lock())
        async with lock:
            connection = self._connections.get(origin)
            if connection is not None and not connection.closed:
                return connection
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._connect_timeout):
                    _, connection = await loop.create_connection(
                        _Http2Connection, host, port, ssl=self._tls, server_hostname=host
                    )
                    await connection.ready()
            except (OSError, ssl.SSLError) as error:
                raise ConnectionLost(
                    f"cannot connect to {origin}: {type(error).__name__}"
                ) from None
            self._opened += 1
            connection.number = self._opened
            self._connections[origin] = connection
            return connection

    def retire(self, url: str, number: int) -> bool:
        """The next request to ``url``'s origin opens a new connection if connection
        ``number`` is still the one in use; its streams in flight finish first. Returns
        whether it was (False: already replaced)."""
        parts = urlsplit(url)
        origin = f"{parts.hostname}:{parts.port or 443}"
        connection = self._connections.get(origin)
        if connection is None or connection.number != number:
            return False
        del self._connections[origin]
        connection.retired = True
        connection.close_if_idle()
        self._retired = [c for c in self._retired if not c.closed]
        if not connection.closed:
            self._retired.append(connection)
        return True

    async def close(self) -> None:
        for connection in [*self._connections.values(), *self._retired]:
            connection.close()
        self._connections.clear()
        self._retired.clear()
