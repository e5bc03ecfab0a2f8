"""The remote worker protocol's settings (ATELIER_REMOTE_*): the worker pools, the TLS
listener they reach from outside the cluster, the leases they get and how long their
replays are answered. The server keeps each pool's credential only as its SHA-256; a pool
may hold two at once while its credential is rotated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.kit.settings import EnvReader, port
from services.kit.tls import ServerCertificateFiles, read_server_files

_POOL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The old credential and the new one while a pool's workers move to the new.
MAX_CREDENTIALS_PER_POOL = 2
DEFAULT_TLS_PORT = 50071


@dataclass(frozen=True)
class RemoteSettings:
    # Pool name by the SHA-256 (hex) of its credential.
    pools_by_hash: dict[str, str] = field(default_factory=dict)
    lease_ttl_seconds: float = 60.0
    lease_min_seconds: float = 5.0
    lease_max_seconds: float = 600.0
    heartbeat_seconds: float = 10.0
    retention_seconds: float = 7 * 86400.0
    # The TLS listener for workers outside the cluster (WorkerService and health only);
    # None: off.
    tls: ServerCertificateFiles | None = None
    tls_port: int = DEFAULT_TLS_PORT

    def granted(self, asked_seconds: float) -> float:
        """The lease a claim gets: the worker's ask (0: the default) within the bounds."""
        if asked_seconds <= 0:
            return self.lease_ttl_seconds
        return min(self.lease_max_seconds, max(self.lease_min_seconds, asked_seconds))

    def heartbeat_for(self, lease_seconds: float) -> float:
        """The heartbeat a worker is told: never less than three beats per lease."""
        return min(self.heartbeat_seconds, lease_seconds / 3)

    @classmethod
    def read(cls, reader: EnvReader) -> RemoteSettings:
        pools = read_pools(reader)
        settings = cls(
            pools_by_hash=pools,
            # How long a remote worker's claim lasts without a heartbeat (server clock),
            # unless its claim asks for another duration within the bounds.
            lease_ttl_seconds=reader.seconds("REMOTE_LEASE_TTL", 60, minimum=1, maximum=3600),
            lease_min_seconds=reader.seconds("REMOTE_LEASE_MIN", 5, minimum=1, maximum=3600),
            lease_max_seconds=reader.seconds("REMOTE_LEASE_MAX", 600, minimum=1, maximum=3600),
            # How often remote workers are told to heartbeat.
            heartbeat_seconds=reader.seconds("REMOTE_HEARTBEAT", 10, minimum=0.5, maximum=600),
            # How long claims and calls are kept for replays once their lease ended, then
            # pruned (with the outbox's delivered rows); older replays are refused.
            retention_seconds=reader.seconds(
                "REMOTE_RETENTION", 7 * 86400, minimum=3600, maximum=90 * 86400
            ),
            # The certificate chain and key (PEM) of the TLS listener; re-read when the
            # files change.
            tls=read_server_files(reader, "REMOTE_TLS_CERT", "REMOTE_TLS_KEY"),
            tls_port=port(reader, "CREATION_REMOTE_PORT", DEFAULT_TLS_PORT),
        )
        reader.require(
            settings.lease_min_seconds <= settings.lease_ttl_seconds <= settings.lease_max_seconds,
            "REMOTE_LEASE_TTL",
            "must be between ATELIER_REMOTE_LEASE_MIN and ATELIER_REMOTE_LEASE_MAX",
        )
        reader.require(
            settings.tls is None or bool(pools),
            "REMOTE_TLS_CERT",
            "turns the remote workers' TLS listener on, but ATELIER_REMOTE_POOLS names no "
            "pool: no worker could call it",
        )
        reader.require(
            settings.heartbeat_seconds * 2 <= settings.lease_ttl_seconds,
            "REMOTE_HEARTBEAT",
            f"must be at most half of ATELIER_REMOTE_LEASE_TTL ({settings.lease_ttl_seconds:g}s)",
        )
        return settings


def read_pools(reader: EnvReader) -> dict[str, str]:
    """ATELIER_REMOTE_POOLS: ``name=sha256hex`` entries separated by commas; a name given
    twice holds both credentials (a rotation). Each problem names the entry by its
    position and, when it has one, its pool name, never the text given as a hash (it may
    be the credential itself, pasted by mistake)."""
    pools: dict[str, str] = {}
    counts: dict[str, int] = {}
    entries = [spec.strip() for spec in reader.string("REMOTE_POOLS", "").split(",")]
    for number, spec in enumerate((e for e in entries if e), start=1):
        name, equals, digest = (part.strip() for part in spec.partition("="))
        digest = digest.lower()
        if not equals or not _POOL_NAME.fullmatch(name):
            reader.require(
                False,
                "REMOTE_POOLS",
                f"entry {number} must be name=sha256-hex with a name of a-z, 0-9 and - "
                "(at most 40 characters)",
            )
            continue
        if not _SHA256_HEX.fullmatch(digest):
            reader.require(
                False,
                "REMOTE_POOLS",
                f"entry {number} ({name}) must give the SHA-256 of the pool's credential "
                'in hex (64 characters 0-9, a-f: printf %s "$CREDENTIAL" | sha256sum), '
                "never the credential itself",
            )
            continue
        if digest in pools:
            reader.require(
                False,
                "REMOTE_POOLS",
                f"entry {number} ({name}) repeats a credential hash already given "
                f"(to {pools[digest]}): each credential belongs to one pool, once",
            )
            continue
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > MAX_CREDENTIALS_PER_POOL:
            reader.require(
                False,
                "REMOTE_POOLS",
                f"entry {number} gives {name} a credential hash beyond its "
                f"{MAX_CREDENTIALS_PER_POOL} (the old and the new one while rotating)",
            )
            continue
        pools[digest] = name
    return pools
