"""A local APNs: a real TLS + HTTP/2 server that checks each push the way Apple does
(provider token, headers, payload), records what it accepts, and answers Apple's errors
on demand per device token. The test suite and `atelier dev` use it, so pushes can be
seen without an Apple account.

Run alone: ``python -m services.dev.apns_peer --public-key PEM --key-id ID --team-id ID
--bundle-id ID --state-dir DIR``; it prints one JSON line (url, ca_file) once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import signal
import ssl
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, DataReceived, RequestReceived, StreamEnded, StreamReset
from h2.settings import SettingCodes

# Apple's rules, stated here from Apple's documentation ("Sending notification requests to
# APNs", "Starting and updating Live Activities with ActivityKit push notifications"), not
# imported from notify: a rule notify gets wrong, its peer still refuses.
# The largest body per apns-push-type, in bytes: 4 KB, 5 KB for VoIP.
APPLE_PAYLOAD_LIMITS = {"voip": 5120}
APPLE_DEFAULT_PAYLOAD_LIMIT = 4096
# apns-priority: 10 sends at once, 5 as power allows, 1 prioritises power; a background
# push must be 5, a Live Activity's 5 or 10. Other types: 5 or 10.
APPLE_PRIORITIES = {"alert": ("10", "5", "1"), "background": ("5",), "liveactivity": ("10", "5")}
APPLE_OTHER_PRIORITIES = ("10", "5")
APPLE_COLLAPSE_ID_MAX_BYTES = 64  # "must not exceed 64 bytes"
APPLE_LIVE_ACTIVITY_EVENTS = ("start", "update", "end")
# A Live Activity's topic is the app's bundle id with this suffix; an alert's the bundle id.
APPLE_LIVE_ACTIVITY_TOPIC_SUFFIX = ".push-type.liveactivity"
# A well-formed device token Apple never issues (all zeroes): answered BadDeviceToken once
# the provider token and topic pass, which is what `atelier push doctor` relies on.
UNISSUED_DEVICE_TOKEN = "00" * 32

TOKEN_MAX_AGE_SECONDS = 3600
PUSH_TYPES = ("alert", "background", "liveactivity", "voip", "complication", "fileprovider")


@dataclass(frozen=True)
class Received:
    """A push the peer accepted."""

    device_token: str
    headers: dict[str, str]
    payload: dict[str, Any]
    apns_id: str
    provider_token: str


@dataclass
class Failure:
    """An answer to give instead of accepting: ``times`` None means every time."""

    status: int
    reason: str
    times: int | None = 1
    timestamp_ms: int | None = None


class Refusal(Exception):
    def __init__(self, status: int, reason: str, timestamp_ms: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.timestamp_ms = timestamp_ms


@dataclass
class PeerRules:
    public_key: ec.EllipticCurvePublicKey
    key_id: str
    team_id: str
    bundle_id: str
    clock: Callable[[], float] = time.time


@dataclass
class PeerState:
    received: list[Received] = field(default_factory=list)
    failures: dict[str, Failure] = field(default_factory=dict)
    # Every exchange: (device token, status, reason), accepted or not.
    answers: list[tuple[str, int, str]] = field(default_factory=list)
    expired_tokens: set[str] = field(default_factory=set)
    seen_tokens: set[str] = field(default_factory=set)
    verified: dict[str, int] = field(default_factory=dict)
    # Scripted: a connection refuses to change its provider token (429).
    refuse_token_updates: bool = False


@dataclass
class Link:
    """One client connection as APNs sees it: the provider token it carries. APNs ties
    token updates to a connection; a new connection starts with whichever valid token."""

    provider_token: str | None = None


class ApnsPeer:
    def __init__(self, rules: PeerRules, state_dir: Path, host: str = "127.0.0.1") -> None:
        self.rules = rules
        self.state = PeerState()
        self._state_dir = state_dir
        self._host = host
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Event()
        self.port = 0
        self.on_accept: Callable[[Received], None] | None = None
        self.connections: set[asyncio.Transport] = set()

    @property
    def url(self) -> str:
        return f"https://{self._host}:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self._state_dir / "apns-peer-cert.pem")

    async def start(self, port: int = 0) -> None:
        context = self._tls_context()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self._host, port, ssl=context
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            # Python 3.11's Server has no close_clients(): close what is still open.
            for transport in list(self.connections):
                transport.close()
            await self._server.wait_closed()

    # -- what tests steer and read ---------------------------------------------------------

    def fail(
        self,
        device_token: str,
        status: int,
        reason: str,
        *,
        times: int | None = 1,
        timestamp: datetime | None = None,
    ) -> None:
        stamp = None if timestamp is None else int(timestamp.timestamp() * 1000)
        self.state.failures[device_token] = Failure(status, reason, times, stamp)

    def expire_provider_tokens(self) -> None:
        """Every provider token seen so far is answered ExpiredProviderToken from now on."""
        self.state.expired_tokens |= self.state.seen_tokens

    def refuse_token_updates(self) -> None:
        """From now on a connection that carried a provider token answers any other one
        with 429 TooManyProviderTokenUpdates (APNs' answer to an update within 20 minutes)
        and keeps its token; a new connection takes any valid token."""
        self.state.refuse_token_updates = True

    def received_by(self, device_token: str) -> list[Received]:
        return [r for r in self.state.received if r.device_token == device_token]

    async def wait_for(self, done: Callable[[], bool], seconds: float = 10.0) -> None:
        """Until ``done()`` holds after an exchange (TimeoutError after ``seconds``)."""
        async with asyncio.timeout(seconds):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    # -- one request -------------------------------------------------------------------------

    def answer(
        self, headers: dict[str, str], body: bytes, link: Link | None = None
    ) -> tuple[int, dict[str, Any] | None]:
        device_token = headers.get(":path", "").removeprefix("/3/device/")
        try:
            received = self._check(device_token, headers, body, link or Link())
        except Refusal as refusal:
            self._note(device_token, refusal.status, refusal.reason)
            reply: dict[str, Any] = {"reason": refusal.reason}
            if refusal.status == 410:
                reply["timestamp"] = refusal.timestamp_ms or int(self.rules.clock() * 1000)
            return refusal.status, reply
        self.state.received.append(received)
        if self.on_accept is not None:
            self.on_accept(received)
        self._note(device_token, 200, "")
        return 200, None

    def _note(self, device_token: str, status: int, reason: str) -> None:
        self.state.answers.append((device_token, status, reason))
        self._changed.set()

    def _check(
        self, device_token: str, headers: dict[str, str], body: bytes, link: Link
    ) -> Received:
        if headers.get(":method") != "POST":
            raise Refusal(405, "MethodNotAllowed")
        if not headers.get(":path", "").startswith("/3/device/"):
            raise Refusal(404, "BadPath")
        provider_token = self._check_provider_token(headers.get("authorization", ""))
        self._check_link(link, provider_token)
        failure = self._failure_for(device_token)
        if failure is not None:
            raise Refusal(failure.status, failure.reason, failure.timestamp_ms)
        # The topic is the provider's to push to or not, whatever the device: checked
        # first, so a dummy device token shows whether the credentials and topic are good.
        push_type = self._check_headers(headers)
        # Without Apple's registry of devices every well-formed token is taken as one,
        # except the dummy that no device has (as Apple answers a token it never issued).
        if not _is_device_token(device_token) or device_token == UNISSUED_DEVICE_TOKEN:
            raise Refusal(400, "BadDeviceToken")
        payload = self._check_payload(push_type, body)
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        return Received(device_token, dict(headers), payload, apns_id, provider_token)

    def _failure_for(self, device_token: str) -> Failure | None:
        failure = self.state.failures.get(device_token)
        if failure is None:
            return None
        if failure.times is not None:
            failure.times -= 1
            if failure.times <= 0:
                del self.state.failures[device_token]
        return failure

    def _check_provider_token(self, authorization: str) -> str:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Refusal(403, "MissingProviderToken")
        self.state.seen_tokens.add(token)
        if token in self.state.expired_tokens:
            raise Refusal(403, "ExpiredProviderToken")
        issued_at = self.state.verified.get(token)
        if issued_at is None:
            issued_at = self._verify(token)
            self.state.verified[token] = issued_at
        age = self.rules.clock() - issued_at
        if age >= TOKEN_MAX_AGE_SECONDS:
            raise Refusal(403, "ExpiredProviderToken")
        if age < -60:
            raise Refusal(403, "InvalidProviderToken")
        return token

    def _check_link(self, link: Link, provider_token: str) -> None:
        if link.provider_token is None or link.provider_token == provider_token:
            link.provider_token = provider_token
            return
        if self.state.refuse_token_updates:
            raise Refusal(429, "TooManyProviderTokenUpdates")
        link.provider_token = provider_token

    def _verify(self, token: str) -> int:
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(
                token,
                self.rules.public_key,
                algorithms=["ES256"],
                options={"verify_exp": False, "verify_iat": False, "require": ["iss", "iat"]},
            )
        except jwt.InvalidTokenError:
            raise Refusal(403, "InvalidProviderToken") from None
        if header.get("kid") != self.rules.key_id:
            raise Refusal(403, "InvalidProviderToken")
        if claims.get("iss") != self.rules.team_id:
            raise Refusal(403, "InvalidProviderToken")
        issued_at = claims.get("iat")
        if not isinstance(issued_at, int):
            raise Refusal(403, "InvalidProviderToken")
        return issued_at

    def _check_headers(self, headers: dict[str, str]) -> str:
        push_type = headers.get("apns-push-type", "")
        if push_type not in PUSH_TYPES:
            raise Refusal(400, "InvalidPushType")
        topic = headers.get("apns-topic", "")
        if not topic:
            raise Refusal(400, "MissingTopic")
        if topic != _topic_for(self.rules.bundle_id, push_type):
            raise Refusal(400, "TopicDisallowed")
        priority = headers.get("apns-priority")
        if priority is not None and priority not in APPLE_PRIORITIES.get(
            push_type, APPLE_OTHER_PRIORITIES
        ):
            raise Refusal(400, "BadPriority")
        expiration = headers.get("apns-expiration")
        if expiration is not None and not expiration.isdigit():
            raise Refusal(400, "BadExpirationDate")
        collapse_id = headers.get("apns-collapse-id")
        if collapse_id is not None and len(collapse_id.encode()) > APPLE_COLLAPSE_ID_MAX_BYTES:
            raise Refusal(400, "BadCollapseId")
        apns_id = headers.get("apns-id")
        if apns_id is not None:
            try:
                uuid.UUID(apns_id)
            except ValueError:
                raise Refusal(400, "BadMessageId") from None
        return push_type

    def _check_payload(self, push_type: str, body: bytes) -> dict[str, Any]:
        if not body:
            raise Refusal(400, "PayloadEmpty")
        if len(body) > APPLE_PAYLOAD_LIMITS.get(push_type, APPLE_DEFAULT_PAYLOAD_LIMIT):
            raise Refusal(413, "PayloadTooLarge")
        try:
            payload = json.loads(body)
        except ValueError:
            raise Refusal(400, "BadPayload") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            raise Refusal(400, "BadPayload")
        if push_type == "liveactivity":
            _check_live_activity(payload["aps"])
        return payload

    # -- TLS ------------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        key_path = self._state_dir / "apns-peer-key.pem"
        cert_path = Path(self.ca_file)
        key = ec.generate_private_key(ec.SECP256R1())
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)
        cert_path.write_bytes(
            _self_signed(key, self._host).public_bytes(serialization.Encoding.PEM)
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path, key_path)
        context.set_alpn_protocols(["h2"])
        return context


def _topic_for(bundle_id: str, push_type: str) -> str:
    if push_type == "liveactivity":
        return bundle_id + APPLE_LIVE_ACTIVITY_TOPIC_SUFFIX
    return bundle_id


def _check_live_activity(aps: dict[str, Any]) -> None:
    event = aps.get("event")
    if event not in APPLE_LIVE_ACTIVITY_EVENTS:
        raise Refusal(400, "BadLiveActivityEvent")
    if not isinstance(aps.get("timestamp"), int):
        raise Refusal(400, "BadLiveActivityTimestamp")
    if event in ("start", "update") and not isinstance(aps.get("content-state"), dict):
        raise Refusal(400, "MissingContentState")
    if event == "start" and (
        not isinstance(aps.get("attributes-type"), str)
        or not isinstance(aps.get("attributes"), dict)
    ):
        raise Refusal(400, "MissingAttributes")


def _is_device_token(token: str) -> bool:
    return len(token) >= 64 and len(token) % 2 == 0 and all(c in "0123456789abcdef" for c in token)


def _self_signed(key: ec.EllipticCurvePrivateKey, host: str) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "atelier APNs peer")])
    now = datetime.now(UTC)
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )


class _Connection(asyncio.Protocol):
    """One client connection: h2's state machine, answered synchronously per stream."""

    def __init__(self, peer: ApnsPeer) -> None:
        self._peer = peer
        self._h2 = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self._streams: dict[int, tuple[dict[str, str], bytearray]] = {}
        self._transport: asyncio.Transport | None = None
        self._link = Link()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always a subclass of asyncio.Transport (uvloop's
        # TLS transport implements the interface without inheriting it).
        self._transport = cast(asyncio.Transport, transport)
        self._peer.connections.add(self._transport)
        self._h2.local_settings.update({SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
        self._h2.initiate_connection()
        self._transport.write(self._h2.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._peer.connections.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        try:
            events = self._h2.receive_data(data)
        except Exception:
            self._transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived):
                headers = {str(k): str(v) for k, v in event.headers or []}
                self._streams[event.stream_id] = (headers, bytearray())
            elif isinstance(event, DataReceived):
                held = self._streams.get(event.stream_id)
                if held is not None:
                    held[1].extend(event.data or b"")
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamEnded):
                self._respond(event.stream_id)
            elif isinstance(event, StreamReset):
                self._streams.pop(event.stream_id, None)
            elif isinstance(event, ConnectionTerminated):
                self._transport.close()
        self._transport.write(self._h2.data_to_send())

    def _respond(self, stream_id: int) -> None:
        held = self._streams.pop(stream_id, None)
        if held is None:
            return
        headers, body = held
        status, reply = self._peer.answer(headers, bytes(body), self._link)
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        response = [(":status", str(status)), ("apns-id", apns_id)]
        if reply is None:
            self._h2.send_headers(stream_id, response, end_stream=True)
            return
        content = json.dumps(reply).encode()
        response += [("content-type", "application/json"), ("content-length", str(len(content)))]
        self._h2.send_headers(stream_id, response)
        self._h2.send_data(stream_id, content, end_stream=True)


# -- as a process (atelier dev, the bench) ---------------------------------------------------

# What `atelier dev` signs with: a key of its own in the state dir and made-up ids.
DEV_KEY_ID = "DEVKEY0001"
DEV_TEAM_ID = "DEVTEAM001"
DEV_BUNDLE_ID = "dev.atelier.app"


def ensure_dev_key(state_dir: Path) -> tuple[Path, Path]:
    """A P-256 provider key for local runs (made once, kept): its private and public PEMs."""
    state_dir.mkdir(parents=True, exist_ok=True)
    private_path = state_dir / "apns-dev-key.p8"
    public_path = state_dir / "apns-dev-key.pub.pem"
    if not private_path.exists() or not public_path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        private_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        private_path.chmod(0o600)
        public_path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return private_path, public_path


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apns_peer", description=__doc__)
    parser.add_argument("--public-key", required=True, help="PEM of the provider key's public half")
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--team-id", required=True)
    parser.add_argument("--bundle-id", required=True)
    parser.add_argument("--state-dir", required=True, help="where the TLS certificate is written")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="do not print each accepted push")
    parser.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="TOKEN=STATUS:REASON",
        help="answer this device token with an error every time (e.g. …=410:Unregistered)",
    )
    args = parser.parse_args(argv)
    failures: dict[str, Failure] = {}
    for spec in args.fail:
        token, _, answer = spec.partition("=")
        status, _, reason = answer.partition(":")
        if not token or not status.isdigit() or not reason:
            parser.error(f"--fail {spec!r}: expected TOKEN=STATUS:REASON")
        failures[token.lower()] = Failure(int(status), reason, times=None)
    public_key = serialization.load_pem_public_key(Path(args.public_key).read_bytes())
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        parser.error("--public-key must be an EC public key")
    rules = PeerRules(public_key, args.key_id, args.team_id, args.bundle_id)
    return asyncio.run(
        _serve(rules, Path(args.state_dir), args.host, args.port, args.quiet, failures)
    )


async def _serve(
    rules: PeerRules,
    state_dir: Path,
    host: str,
    port: int,
    quiet: bool,
    failures: dict[str, Failure],
) -> int:
    peer = ApnsPeer(rules, state_dir, host)
    peer.state.failures.update(failures)
    if not quiet:
        peer.on_accept = _print_push
    await peer.start(port)
    print(json.dumps({"url": peer.url, "ca_file": peer.ca_file}), flush=True)
    stop = asyncio.Event()
    # SIGTERM (atelier dev stopping its children) is a clean stop, not a crash.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await peer.close()
    return 0


def _print_push(received: Received) -> None:
    entry = {
        "action": "apns_peer_push",
        "device": "…" + received.device_token[-8:],
        "push_type": received.headers.get("apns-push-type"),
        "priority": received.headers.get("apns-priority"),
        "apns_id": received.apns_id,
        "payload": received.payload,
    }
    print(json.dumps(entry), flush=True)


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except KeyboardInterrupt:
        sys.exit(0)
