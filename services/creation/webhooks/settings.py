"""The webhook deliverer's knobs (ATELIER_WEBHOOK_*), validated at start."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from services.kit.settings import EnvReader

DAY = 86400.0
# After the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, 10 h (37 h 35 min in
# all; at least 30 h with every delay at its low jitter), each with ±20% jitter
# (docs/webhooks.md): nine attempts.
DEFAULT_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0, 36000.0)


@dataclass(frozen=True)
class WebhookSettings:
    # Deliveries claimed per statement, and at most this many in flight per process.
    batch: int = 100
    concurrency: int = 256
    # The fallback look for due deliveries when no NOTIFY came.
    poll_seconds: float = 1.0
    # One attempt's limit (resolution, connection, request, answer).
    timeout_seconds: float = 10.0
    # How long a claim holds a delivery: past it, another deliverer takes it again (its
    # deliverer died). Longer than the timeout.
    claim_seconds: float = 60.0
    # Seconds after each failed attempt before the next; past the last, failed.
    retry_schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    # ± this share of each delay, at random.
    jitter: float = 0.2
    # A Retry-After longer than the schedule's delay is honoured up to this.
    retry_after_max_seconds: float = DAY
    # An endpoint whose attempts have all failed for this long is disabled ('failing').
    disable_after_seconds: float = 5 * DAY
    # Tests and dev only (prod refuses them): http URLs, and networks beside public ones.
    allow_http: bool = False
    allowed_networks: tuple[str, ...] = ()
    # A CA file trusted beside the system's (tests' own https receivers).
    ca_file: str = ""
    # How often an endpoint's host is resolved (and its addresses checked) again.
    resolve_seconds: float = 60.0
    # How often the log of finished deliveries is pruned, and after how long.
    retention_seconds: float = 30 * DAY

    @property
    def span_seconds(self) -> float:
        """How long a delivery is retried, at the least (every delay at its low jitter)."""
        return sum(self.retry_schedule) * (1 - self.jitter)

    @classmethod
    def read(cls, reader: EnvReader, env: str) -> WebhookSettings:
        raw = reader.string("WEBHOOK_RETRY_SCHEDULE", "")
        schedule: tuple[float, ...] = DEFAULT_SCHEDULE
        if raw.strip():
            try:
                schedule = tuple(float(part) for part in raw.split(",") if part.strip())
            except ValueError:
                schedule = ()
            reader.require(
                bool(schedule) and all(0 < s <= DAY for s in schedule) and len(schedule) <= 50,
                "WEBHOOK_RETRY_SCHEDULE",
                "must be 1 to 50 comma-separated delays in seconds, each above 0 and at most 86400",
            )
        networks = tuple(
            n.strip() for n in reader.string("WEBHOOK_ALLOWED_NETWORKS", "").split(",") if n.strip()
        )
        allow_http = reader.string("WEBHOOK_ALLOW_HTTP", "false", choices=("true", "false"))
        settings = cls(
            batch=reader.integer("WEBHOOK_BATCH", 100, minimum=1, maximum=1000),
            concurrency=reader.integer("WEBHOOK_CONCURRENCY", 256, minimum=1, maximum=10_000),
            poll_seconds=reader.seconds("WEBHOOK_POLL", 1, minimum=0.05, maximum=300),
            timeout_seconds=reader.seconds("WEBHOOK_TIMEOUT", 10, minimum=0.1, maximum=10),
            claim_seconds=reader.seconds("WEBHOOK_CLAIM", 60, minimum=1, maximum=3600),
            retry_schedule=schedule or DEFAULT_SCHEDULE,
            jitter=reader.ratio("WEBHOOK_JITTER", 0.2),
            retry_after_max_seconds=reader.seconds(
                "WEBHOOK_RETRY_AFTER_MAX", DAY, minimum=1, maximum=7 * DAY
            ),
            disable_after_seconds=reader.seconds(
                "WEBHOOK_DISABLE_AFTER", 5 * DAY, minimum=1, maximum=90 * DAY
            ),
            allow_http=allow_http == "true",
            allowed_networks=networks,
            ca_file=reader.string("WEBHOOK_CA_FILE", ""),
            resolve_seconds=reader.seconds("WEBHOOK_RESOLVE_PERIOD", 60, minimum=0, maximum=3600),
            retention_seconds=reader.seconds(
                "WEBHOOK_RETENTION", 30 * DAY, minimum=60, maximum=365 * DAY
            ),
        )
        reader.require(
            settings.claim_seconds > settings.timeout_seconds,
            "WEBHOOK_CLAIM",
            f"must be longer than ATELIER_WEBHOOK_TIMEOUT ({settings.timeout_seconds:g}s)",
        )
        reader.require(
            settings.jitter < 1, "WEBHOOK_JITTER", "must be below 1 (a share of each delay)"
        )
        reader.require(
            _networks_valid(networks),
            "WEBHOOK_ALLOWED_NETWORKS",
            "must be a comma-separated list of networks (CIDR)",
        )
        reader.require(
            not (env == "prod" and networks),
            "WEBHOOK_ALLOWED_NETWORKS",
            "is a test setting: prod delivers to public addresses only",
        )
        reader.require(
            not (env == "prod" and settings.allow_http),
            "WEBHOOK_ALLOW_HTTP",
            "is a test setting: prod delivers over https only",
        )
        reader.require(
            env != "prod" or settings.span_seconds >= DAY,
            "WEBHOOK_RETRY_SCHEDULE",
            "must retry for at least 24 hours in prod (its delays, less the jitter)",
        )
        reader.require(
            not settings.ca_file or Path(settings.ca_file).is_file(),
            "WEBHOOK_CA_FILE",
            "must name a readable PEM file",
        )
        return settings


def _networks_valid(networks: tuple[str, ...]) -> bool:
    try:
        for network in networks:
            ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False
    return True
