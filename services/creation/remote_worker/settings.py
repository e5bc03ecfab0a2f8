"""The reference remote worker's settings (ATELIER_REMOTE_WORKER_*): where it calls and
how (TLS, trusting a CA), as which pool and worker, how many jobs at once. The credential
is a secret: never echoed.

The worker dials TLS unless told otherwise, and plaintext only to a loopback address
unless told that too: a pool's credential crossing a network in the clear is a stolen
pool."""

from __future__ import annotations

import ipaddress
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from services.creation.remote_worker.client import FAULTS
from services.kit.settings import EnvReader
from services.kit.tls import CertificateError, read_certificates

# ATELIER_REMOTE_WORKER_PLAINTEXT: off (TLS), to a loopback address only, or anywhere
# (a cluster network trusted on its own, e.g. creation's internal listener).
PLAINTEXT_OFF = "off"
PLAINTEXT_LOOPBACK = "loopback"
PLAINTEXT_ANYWHERE = "anywhere"
PLAINTEXT_MODES = (PLAINTEXT_OFF, PLAINTEXT_LOOPBACK, PLAINTEXT_ANYWHERE)


def address_host(address: str) -> str:
    """The host of a gRPC target: ``host:port``, ``[v6]:port``, ``dns:///host:port``."""
    target = address
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
    if target.startswith("["):
        return target[1:].partition("]")[0]
    if target.count(":") > 1:
        return target  # a bare IPv6 address
    return target.rpartition(":")[0] if ":" in target else target


def is_loopback(address: str) -> bool:
    """True when ``address`` cannot leave this machine: a unix socket, localhost, or a
    loopback IP (127.0.0.0/8, ::1)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address_host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RemoteWorkerSettings:
    credential: str = field(repr=False)
    worker_id: str
    # creation's WorkerService: the TLS listener (host:port), or the internal one.
    address: str
    concurrency: int
    poll_seconds: float
    provider_poll_seconds: float
    drain_seconds: float
    lease_seconds: float
    fault: str
    # The in-process worker's defaults (ATELIER_BACKOFF_BASE, _MAX).
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 300.0
    # The CA (PEM) the server's certificate must chain to; None: the system's roots.
    ca: Path | None = None
    plaintext: str = PLAINTEXT_OFF

    @property
    def uses_tls(self) -> bool:
        return self.plaintext == PLAINTEXT_OFF

    @classmethod
    def read(cls, reader: EnvReader, address: str = "") -> RemoteWorkerSettings:
        """``address`` (``--remote``) wins over ATELIER_REMOTE_WORKER_ADDRESS."""
        default_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        ca = reader.string("REMOTE_WORKER_CA", "")
        settings = cls(
            # The pool's credential (the server knows its SHA-256 from ATELIER_REMOTE_POOLS).
            credential=reader.secret("REMOTE_WORKER_CREDENTIAL", "", min_length=16),
            worker_id=reader.string("REMOTE_WORKER_ID", "") or default_id,
            address=address or reader.string("REMOTE_WORKER_ADDRESS", ""),
            # The CA that signed the server's certificate (PEM), beside no other.
            ca=Path(ca) if ca else None,
            # Plaintext instead of TLS: off, loopback (only to this machine), anywhere.
            plaintext=reader.string(
                "REMOTE_WORKER_PLAINTEXT", PLAINTEXT_OFF, choices=PLAINTEXT_MODES
            ),
            # Jobs this worker runs at once.
            concurrency=reader.integer("REMOTE_WORKER_CONCURRENCY", 4, minimum=1, maximum=256),
            # How long to wait before claiming again after a claim found nothing.
            poll_seconds=reader.seconds("REMOTE_WORKER_POLL", 1, minimum=0.01, maximum=60),
            # How often a running job asks its provider how it is going.
            provider_poll_seconds=reader.seconds(
                "REMOTE_WORKER_PROVIDER_POLL", 1, minimum=0.01, maximum=60
            ),
            # On SIGTERM, how long running jobs may take before they are handed back.
            drain_seconds=reader.seconds("REMOTE_WORKER_DRAIN", 8, minimum=0, maximum=300),
            # The lease to ask for (0: the server's default; the server applies its bounds).
            lease_seconds=reader.seconds("REMOTE_WORKER_LEASE", 0, minimum=0, maximum=86400),
            # Tests only: drop_first_claim throws away the first claim's answer and replays.
            fault=reader.string("REMOTE_WORKER_FAULT", "", choices=FAULTS),
            # The backoff between a provider's poll errors (full jitter, doubling from the
            # base up to the longest), never sooner than the provider asked.
            backoff_base_seconds=reader.seconds(
                "REMOTE_WORKER_BACKOFF_BASE", 2, minimum=0.01, maximum=600
            ),
            backoff_max_seconds=reader.seconds(
                "REMOTE_WORKER_BACKOFF_MAX", 300, minimum=0.01, maximum=86400
            ),
        )
        reader.require(
            bool(settings.address),
            "REMOTE_WORKER_ADDRESS",
            "is required (or --remote ADDRESS): creation's WorkerService, host:port",
        )
        if settings.address and settings.plaintext == PLAINTEXT_LOOPBACK:
            reader.require(
                is_loopback(settings.address),
                "REMOTE_WORKER_PLAINTEXT",
                f"is loopback, but {settings.address} is not a loopback address: the pool's "
                "credential would cross the network in the clear. Dial its TLS listener "
                "(ATELIER_REMOTE_WORKER_PLAINTEXT=off, ATELIER_REMOTE_WORKER_CA), or set "
                "anywhere for a network you trust on its own",
            )
        if settings.ca is not None:
            reader.require(
                settings.uses_tls,
                "REMOTE_WORKER_CA",
                "is for TLS, but ATELIER_REMOTE_WORKER_PLAINTEXT turns TLS off",
            )
            try:
                read_certificates(settings.ca, "CA")
            except CertificateError as error:
                reader.require(False, "REMOTE_WORKER_CA", f"cannot be used: {error}")
        reader.require(
            settings.backoff_base_seconds <= settings.backoff_max_seconds,
            "REMOTE_WORKER_BACKOFF_BASE",
            "must not exceed ATELIER_REMOTE_WORKER_BACKOFF_MAX",
        )
        return settings
