"""One server-side GET of a URL a user named, behind the SSRF guard.

Each hop (the URL, then each redirect's target, at most ``max_redirects``):

1. the URL must be ``https`` with a host and no credentials;
2. the host is resolved once, and every address it resolves to is checked
   (services/kit/addresses.py): one refused address refuses the URL, so a name cannot mix a public
   address with an internal one;
3. the connection goes to a checked address itself (never a second resolution, which a
   rebinding DNS server could answer differently); TLS sends the host name (SNI) and
   checks the certificate against it;
4. the answer must be 200 with a JPEG, PNG or WebP content type and at most
   ``max_bytes`` (a declared Content-Length over it is refused before any body byte is
   read, a body that grows past it is cut off). A redirect (301, 302, 303, 307, 308)
   starts the next hop from step 1.

The whole fetch, every hop included, has one time limit. HTTP/1.1 over h11, one request
per connection, no content coding (``Accept-Encoding: identity``: a compressed body could
hide its size).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import h11

from services.kit.addresses import Address, AddressPolicy
from services.kit.outbound import system_resolver
from services.media.domain import CONTENT_TYPES
from services.media.errors import ImportRefused

# host, port -> the addresses the host resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]
REDIRECTS = frozenset({301, 302, 303, 307, 308})
READ_BYTES = 64 * 1024
USER_AGENT = "atelier-media-import/1"
MAX_URL = 2048


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int
    timeout_seconds: float = 10.0
    max_redirects: int = 3


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str
    # The URL that answered (after redirects).
    url: str


def import_tls(ca_file: str = "") -> ssl.SSLContext:
    """The system's trust store, plus ``ca_file`` when given (a test's own CA)."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


@dataclass(frozen=True)
class _Target:
    url: str
    host: str
    port: int
    path: str


def _target(url: str) -> _Target:
    if len(url) > MAX_URL:
        raise ImportRefused("URL_INVALID", f"the URL is longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ImportRefused("URL_INVALID", "the URL cannot be read") from None
    if parts.scheme.lower() != "https":
        raise ImportRefused("URL_NOT_HTTPS", "only https URLs are fetched")
    if not parts.hostname:
        raise ImportRefused("URL_INVALID", "the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ImportRefused("URL_INVALID", "the URL must not carry credentials")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return _Target(url, parts.hostname.rstrip(".").lower(), port or 443, path)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class UrlFetcher:
    def __init__(
        self,
        policy: AddressPolicy,
        limits: FetchLimits,
        tls: ssl.SSLContext | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        self._policy = policy
        self._limits = limits
        self._tls = tls or ssl.create_default_context()
        self._resolve = resolver

    async def fetch(self, url: str) -> Fetched:
        """The image ``url`` answers with; raises ImportRefused (cause, message)."""
        try:
            async with asyncio.timeout(self._limits.timeout_seconds):
                return await self._follow(url)
        except TimeoutError:
            raise ImportRefused(
                "TIMEOUT", f"the fetch took longer than {self._limits.timeout_seconds:g} s"
            ) from None

    async def _follow(self, url: str) -> Fetched:
        redirects = 0
        while True:
            target = _target(url)
            addresses = await self._checked_addresses(target)
            status, headers, body = await self._get(target, addresses)
            if status in REDIRECTS:
                location = headers.get("location")
                if not location:
                    raise ImportRefused("BAD_REDIRECT", f"a {status} without a Location")
                redirects += 1
                if redirects > self._limits.max_redirects:
                    raise ImportRefused(
                        "TOO_MANY_REDIRECTS",
                        f"more than {self._limits.max_redirects} redirects",
                    )
                url = urljoin(target.url, location)
                continue
            if status != 200:
                raise ImportRefused("STATUS_NOT_OK", f"the server answered {status}")
            content_type = headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type not in CONTENT_TYPES:
                raise ImportRefused(
                    "CONTENT_TYPE_NOT_ALLOWED",
                    f"the server sent {content_type or 'no content type'};"
                    " image/jpeg, image/png or image/webp are accepted",
                )
            assert body is not None
            return Fetched(body, content_type, target.url)

    async def _checked_addresses(self, target: _Target) -> list[str]:
        literal = _literal(target.host)
        if literal is not None:
            found = [str(literal)]
        else:
            try:
                found = await self._resolve(target.host, target.port)
            except OSError:
                found = []
            if not found:
                raise ImportRefused("HOST_UNRESOLVED", f"{target.host} does not resolve")
        for text in found:
            address = ipaddress.ip_address(text)
            why = self._policy.why_refused(address)
            if why is not None:
                raise ImportRefused(
                    "ADDRESS_NOT_ALLOWED", f"{target.host} resolves to {address}, {why}"
                )
        return found

    async def _connect(
        self, target: _Target, addresses: list[str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure: Exception | None = None
        for address in addresses:
            try:
                # To the address checked; TLS is for the host name (SNI, certificate).
                return await asyncio.open_connection(
                    address, target.port, ssl=self._tls, server_hostname=target.host
                )
            except ssl.SSLError as error:
                raise ImportRefused(
                    "TLS_FAILED", f"TLS with {target.host} failed: {error}"
                ) from None
            except OSError as error:
                failure = error
        raise ImportRefused(
            "CONNECT_FAILED", f"could not connect to {target.host}: {failure}"
        ) from None

    async def _get(
        self, target: _Target, addresses: list[str]
    ) -> tuple[int, dict[str, str], bytes | None]:
        """Status, headers (lowercase names) and, for a 200, the body."""
        reader, writer = await self._connect(target, addresses)
        try:
            connection = h11.Connection(h11.CLIENT)
            default_port = target.port == 443
            host = target.host if default_port else f"{target.host}:{target.port}"
            if ":" in target.host and not default_port:
                host = f"[{target.host}]:{target.port}"
            request = h11.Request(
                method="GET",
                target=target.path,
                headers=[
                    ("host", host),
                    ("user-agent", USER_AGENT),
                    ("accept", ", ".join(CONTENT_TYPES)),
                    ("accept-encoding", "identity"),
                    ("connection", "close"),
                ],
            )
            writer.write(connection.send(request) + connection.send(h11.EndOfMessage()))
            await writer.drain()
            return await self._answer(connection, reader)
        except h11.ProtocolError:
            raise ImportRefused("BAD_RESPONSE", "the server's answer is not HTTP/1.1") from None
        except ssl.SSLError as error:
            raise ImportRefused("TLS_FAILED", f"TLS with {target.host} failed: {error}") from None
        except OSError as error:
            raise ImportRefused("CONNECT_FAILED", f"the connection failed: {error}") from None
        finally:
            writer.close()

    async def _answer(
        self, connection: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[int, dict[str, str], bytes | None]:
        limit = self._limits.max_bytes
        status = 0
        headers: dict[str, str] = {}
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_BYTES)
                connection.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
                if status != 200:
                    return status, headers, None
                declared = headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise ImportRefused(
                        "TOO_LARGE", f"the server declares {declared} bytes; at most {limit}"
                    )
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise ImportRefused("TOO_LARGE", f"the body is over {limit} bytes")
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                if not status:
                    raise ImportRefused("BAD_RESPONSE", "the server closed without answering")
                return status, headers, bytes(body)
