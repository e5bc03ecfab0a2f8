"""The remote worker protocol's settings (ATELIER_REMOTE_*): the worker pools, the
leases they get and how long their replays are answered. The server keeps each pool's
credential only as its SHA-256."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.kit.settings import EnvReader

_POOL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RemoteSettings:
    # Pool name by the SHA-256 (hex) of its credential.
    pools_by_hash: dict[str, str] = field(default_factory=dict)
    lease_ttl_seconds: float = 60.0
    lease_min_seconds: float = 5.0
    lease_max_seconds: float = 600.0
    heartbeat_seconds: float = 10.0
    retention_seconds: float = 7 * 86400.0

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
        pools: dict[str, str] = {}
        for spec in reader.string("REMOTE_POOLS", "").split(","):
            if not spec.strip():
                continue
            name, _, digest = (part.strip() for part in spec.partition("="))
            good = bool(_POOL_NAME.fullmatch(name) and _SHA256_HEX.fullmatch(digest.lower()))
            reader.require(
                good and name not in pools.values() and digest.lower() not in pools,
                "REMOTE_POOLS",
                "must be name=sha256-hex pairs separated by commas, each name (a-z, 0-9, -) "
                "and each credential once",
            )
            if good:
                pools[digest.lower()] = name
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
        )
        reader.require(
            settings.lease_min_seconds <= settings.lease_ttl_seconds <= settings.lease_max_seconds,
            "REMOTE_LEASE_TTL",
            "must be between ATELIER_REMOTE_LEASE_MIN and ATELIER_REMOTE_LEASE_MAX",
        )
        reader.require(
            settings.heartbeat_seconds * 2 <= settings.lease_ttl_seconds,
            "REMOTE_HEARTBEAT",
            f"must be at most half of ATELIER_REMOTE_LEASE_TTL ({settings.lease_ttl_seconds:g}s)",
        )
        return settings
