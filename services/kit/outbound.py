"""Outbound HTTP calls to addresses someone else named (webhook endpoints), behind the
SSRF guard.

Each call:

1. the URL must be ``https`` (``http`` only when the policy allows it: dev and tests),
   with a host and no credentials;
2. the host is resolved and every address it resolves to is checked (addresses.py): one
   refused address refuses the URL, so a name cannot mix a public address with an
   internal one;
3. the connection goes to a checked address itself (never a second resolution, which a
   rebinding DNS server could answer differently); TLS sends the host name (SNI) and
   checks the certificate against it;
4. the answer is read up to ``max_body_bytes`` (a longer body ends the connection
   instead of being read); a redirect is an answer like any other, never followed;
5. the whole call (resolution, connection, request, answer) has one time limit.

Connections are kept alive and reused per (scheme, host, port), each pinned to the
address it was opened to; the checked addresses are resolved again after
``resolve_seconds``, and a kept connection to an address no longer among them is closed.
A host keeps as many idle connections as it has had calls in flight at once since its
last resolution (at least ``keep_alive``): a caller that sends it 64 calls at a time
reuses 64 connections instead of opening most of them anew for every burst.
HTTP/1.1 over h11, no content coding (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from services.kit.addresses import AddressPolicy

# host, port -> the addresses the host resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]
READ_BYTES = 64 * 1024
MAX_URL = 2048


class OutboundRefused(Exception):
    """The guard refuses the URL (never sent): ``cause`` is a stable word."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


class OutboundFailed(Exception):
    """The call was made and did not get an answer (connection, TLS, timeout, a broken
    answer): ``cause`` is a stable word."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Answer:
    status: int
    # Lowercase names; a repeated header keeps its last value.
    headers: dict[str, str]
    # The start of the body, at most max_body_bytes of it.
    body: bytes


@dataclass(frozen=True)
class OutboundPolicy:
    addresses: AddressPolicy = field(default_factory=AddressPolicy)
    allow_http: bool = False
    timeout_seconds: float = 10.0
    max_body_bytes: int = 4096
    resolve_seconds: float = 60.0
    # Idle connections kept per (scheme, host, port), at least (more while more calls to
    # it are in flight at once).
    keep_alive: int = 16
    user_agent: str = "atelier/1"


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=0, proto=0, flags=0, family=0
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def parse_target(url: str, allow_http: bool) -> Target:
    """The URL's parts; raises OutboundRefused for one the guard never sends to."""
    if len(url) > MAX_URL:
        raise OutboundRefused("URL_INVALID", f"the URL is longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise OutboundRefused("URL_INVALID", "the URL cannot be read") from None
    scheme = parts.scheme.lower()
    if scheme != "https" and not (allow_http and scheme == "http"):
        raise OutboundRefused("URL_NOT_HTTPS", "only https URLs are called")
    if not parts.hostname:
        raise OutboundRefused("URL_INVALID", "the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("URL_INVALID", "the URL must not carry credentials")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    default = 443 if scheme == "https" else 80
    return Target(scheme, parts.hostname.rstrip(".").lower(), port or default, path)


@dataclass
class _Connection:
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    # Exchanges answered on it so far: 0 means fresh (h11's states are IDLE again after
    # every cycle, so they cannot tell a kept connection from a new one).
    answered: int = 0
    # Whether any byte of the current exchange's answer has arrived.
    heard: bool = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class _Host:
    addresses: list[str] = field(default_factory=list)
    resolved_at: float = float("-inf")
    idle: list[_Connection] = field(default_factory=list)
    next_address: int = 0
    # Calls in flight to the host now, and the most at once since its last resolution.
    busy: int = 0
    peak: int = 0


class OutboundClient:
    """POSTs behind the guard, with kept-alive connections."""

    def __init__(
        self,
        policy: OutboundPolicy,
        tls: ssl.SSLContext | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        self._policy = policy
        self._tls = tls or ssl.create_default_context()
        self._resolve = resolver
        self._hosts: dict[tuple[str, str, int], _Host] = {}
        # For tests and the bench: connections opened so far.
        self.connections_opened = 0

    async def post(self, url: str, headers: Sequence[tuple[str, str]], body: bytes) -> Answer:
        """The answer to one POST of ``body``; raises OutboundRefused or OutboundFailed."""
        target = parse_target(url, self._policy.allow_http)
        try:
            async with asyncio.timeout(self._policy.timeout_seconds):
                return await self._post(target, headers, body)
        except TimeoutError:
            raise OutboundFailed(
                "TIMEOUT", f"no answer within {self._policy.timeout_seconds:g} s"
            ) from None

    async def close(self) -> None:
        for host in self._hosts.values():
            for connection in host.idle:
                connection.close()
            host.idle.clear()

    async def _post(
        self, target: Target, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Answer:
        host = self._hosts.setdefault(target.key, _Host())
        await self._checked(target, host)
        host.busy += 1
        host.peak = max(host.peak, host.busy)
        try:
            return await self._send(target, host, headers, body)
        finally:
            host.busy -= 1

    async def _send(
        self, target: Target, host: _Host, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Answer:
        request = h11.Request(
            method="POST",
            target=target.path,
            headers=[
                ("host", target.host_header),
                ("user-agent", self._policy.user_agent),
                ("accept-encoding", "identity"),
                ("content-length", str(len(body))),
                *headers,
            ],
        )
        # A kept connection may have been closed by the server meanwhile: one fresh try.
        while host.idle:
            connection = host.idle.pop()
            try:
                return await self._exchange(target, host, connection, request, body)
            except _Stale:
                connection.close()
        connection = await self._connect(target, host)
        try:
            return await self._exchange(target, host, connection, request, body)
        except _Stale:
            connection.close()
            raise OutboundFailed("CONNECTION_CLOSED", "the server closed the connection") from None

    async def _checked(self, target: Target, host: _Host) -> None:
        if time.monotonic() - host.resolved_at < self._policy.resolve_seconds:
            return
        literal = _literal(target.host)
        if literal is not None:
            found = [str(literal)]
        else:
            try:
                found = await self._resolve(target.host, target.port)
            except OSError:
                found = []
            if not found:
                raise OutboundFailed("HOST_UNRESOLVED", f"{target.host} does not resolve")
        for text in found:
            address = ipaddress.ip_address(text)
            why = self._policy.addresses.why_refused(address)
            if why is not None:
                host.resolved_at = float("-inf")
                for connection in host.idle:
                    connection.close()
                host.idle.clear()
                raise OutboundRefused(
                    "ADDRESS_NOT_ALLOWED", f"{target.host} resolves to {address}, {why}"
                )
        host.addresses = found
        host.resolved_at = time.monotonic()
        host.peak = host.busy
        kept = [c for c in host.idle if c.address in found]
        for connection in host.idle:
            if connection.address not in found:
                connection.close()
        host.idle = kept

    async def _connect(self, target: Target, host: _Host) -> _Connection:
        failure: Exception | None = None
        addresses = host.addresses
        for offset in range(len(addresses)):
            address = addresses[(host.next_address + offset) % len(addresses)]
            try:
                # To the address checked; TLS is for the host name (SNI, certificate).
                if target.scheme == "https":
                    reader, writer = await asyncio.open_connection(
                        address, target.port, ssl=self._tls, server_hostname=target.host
                    )
                else:
                    reader, writer = await asyncio.open_connection(address, target.port)
            except ssl.SSLError as error:
                raise OutboundFailed(
                    "TLS_FAILED", f"TLS with {target.host} failed: {error}"
                ) from None
            except OSError as error:
                failure = error
                continue
            host.next_address = (host.next_address + offset + 1) % len(addresses)
            self.connections_opened += 1
            return _Connection(address, reader, writer)
        raise OutboundFailed(
            "CONNECT_FAILED", f"could not connect to {target.host}: {failure}"
        ) from None

    async def _exchange(
        self,
        target: Target,
        host: _Host,
        connection: _Connection,
        request: h11.Request,
        body: bytes,
    ) -> Answer:
        protocol = connection.protocol
        fresh = connection.answered == 0
        connection.heard = False
        try:
            data = protocol.send(request)
            data += protocol.send(h11.Data(data=body)) if body else b""
            data += protocol.send(h11.EndOfMessage())
            connection.writer.write(data)
            await connection.writer.drain()
            answer, reusable = await self._answer(connection, fresh)
        except (h11.ProtocolError, ssl.SSLError, OSError) as error:
            connection.close()
            if not fresh and not connection.heard:
                # A kept connection that failed before a byte of answer: the server had
                # dropped it (closed, reset, restarted). Not this request's failure.
                raise _Stale() from None
            if isinstance(error, h11.ProtocolError):
                raise OutboundFailed(
                    "BAD_RESPONSE", "the server's answer is not HTTP/1.1"
                ) from None
            if isinstance(error, ssl.SSLError):
                raise OutboundFailed(
                    "TLS_FAILED", f"TLS with {target.host} failed: {error}"
                ) from None
            raise OutboundFailed("CONNECTION_FAILED", f"the connection failed: {error}") from None
        except (_Stale, asyncio.CancelledError):
            connection.close()
            raise
        except BaseException:
            connection.close()
            raise
        connection.answered += 1
        if reusable and len(host.idle) < max(self._policy.keep_alive, host.peak):
            protocol.start_next_cycle()
            host.idle.append(connection)
        else:
            connection.close()
        return answer

    async def _answer(self, connection: _Connection, fresh: bool) -> tuple[Answer, bool]:
        protocol = connection.protocol
        limit = self._policy.max_body_bytes
        status = 0
        headers: dict[str, str] = {}
        body = bytearray()
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(READ_BYTES)
                connection.heard = connection.heard or bool(data)
                if not data and not status and not fresh:
                    # A kept connection the server had closed: nothing was answered.
                    raise _Stale()
                protocol.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    # The rest is not read: this connection ends here.
                    return Answer(status, headers, bytes(body[:limit])), False
            elif isinstance(event, h11.EndOfMessage):
                reusable = protocol.our_state is h11.DONE and protocol.their_state is h11.DONE
                return Answer(status, headers, bytes(body)), reusable
            elif isinstance(event, h11.ConnectionClosed):
                if not status:
                    if not fresh:
                        raise _Stale()
                    raise OutboundFailed("BAD_RESPONSE", "the server closed without answering")
                return Answer(status, headers, bytes(body)), False


class _Stale(Exception):
    """A kept-alive connection turned out closed before it answered."""


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
