"""The APNs settings (``ATELIER_APNS_*``), shared by the sender and `atelier push doctor`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.kit.settings import EnvReader

PRODUCTION_URL = "https://api.push.apple.com"
SANDBOX_URL = "https://api.sandbox.push.apple.com"
ENVIRONMENTS = ("sandbox", "production")


@dataclass(frozen=True)
class ApnsSettings:
    # Off: notify records pushes but nothing sends them (no key configured).
    enabled: bool
    # A .p8 file: the PKCS#8 P-256 private key Apple issued (never logged).
    key_path: str
    key_id: str
    team_id: str
    bundle_id: str
    production_url: str = PRODUCTION_URL
    sandbox_url: str = SANDBOX_URL
    # A CA bundle to trust instead of the system's (the dev/test peer's self-signed one).
    ca_file: str = ""
    # One JWT is reused this long: Apple refuses tokens older than an hour and throttles
    # refreshes more often than every 20 minutes.
    token_refresh_seconds: float = 2400.0
    batch_size: int = 200
    # A claimed push is not claimed again before this: a sender that crashed after sending
    # causes at most one duplicate, this long later.
    lease_seconds: float = 30.0
    request_timeout_seconds: float = 10.0
    max_attempts: int = 8
    backoff_base_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    # How often an idle sender looks for due pushes.
    poll_seconds: float = 0.5
    # While APNs refuses our credentials (key, key id, team, topic, clock) pushes wait,
    # retried with backoff however many attempts that takes, until this long after they
    # were planned; then they fail.
    credentials_hold_seconds: float = 6 * 3600.0

    def base_url(self, environment: str) -> str:
        return self.production_url if environment == "production" else self.sandbox_url

    @classmethod
    def read(cls, reader: EnvReader) -> ApnsSettings:
        settings = cls(
            enabled=reader.string("APNS_ENABLED", "false", choices=("true", "false")) == "true",
            key_path=reader.string("APNS_KEY_PATH", ""),
            key_id=reader.string("APNS_KEY_ID", ""),
            team_id=reader.string("APNS_TEAM_ID", ""),
            bundle_id=reader.string("APNS_BUNDLE_ID", ""),
            production_url=reader.string("APNS_PRODUCTION_URL", PRODUCTION_URL).rstrip("/"),
            sandbox_url=reader.string("APNS_SANDBOX_URL", SANDBOX_URL).rstrip("/"),
            ca_file=reader.string("APNS_CA_FILE", ""),
            token_refresh_seconds=reader.seconds(
                "APNS_TOKEN_REFRESH", 2400.0, minimum=1200, maximum=3600
            ),
            batch_size=reader.integer("APNS_BATCH_SIZE", 200, minimum=1, maximum=5000),
            lease_seconds=reader.seconds("APNS_LEASE", 30.0, minimum=1, maximum=3600),
            request_timeout_seconds=reader.seconds(
                "APNS_REQUEST_TIMEOUT", 10.0, minimum=0.1, maximum=120
            ),
            max_attempts=reader.integer("APNS_MAX_ATTEMPTS", 8, minimum=1, maximum=100),
            backoff_base_seconds=reader.seconds(
                "APNS_BACKOFF_BASE", 1.0, minimum=0.001, maximum=3600
            ),
            backoff_max_seconds=reader.seconds(
                "APNS_BACKOFF_MAX", 300.0, minimum=0.001, maximum=24 * 3600
            ),
            poll_seconds=reader.seconds("APNS_POLL", 0.5, minimum=0.01, maximum=60),
            credentials_hold_seconds=reader.seconds(
                "APNS_CREDENTIALS_HOLD", 6 * 3600.0, minimum=60, maximum=7 * 24 * 3600
            ),
        )
        reader.require(
            settings.request_timeout_seconds * 2 < settings.lease_seconds,
            "APNS_LEASE",
            "must exceed twice ATELIER_APNS_REQUEST_TIMEOUT (a send and its one retry)",
        )
        if settings.enabled:
            for name, value in (
                ("APNS_KEY_PATH", settings.key_path),
                ("APNS_KEY_ID", settings.key_id),
                ("APNS_TEAM_ID", settings.team_id),
                ("APNS_BUNDLE_ID", settings.bundle_id),
            ):
                reader.require(value != "", name, "is required when ATELIER_APNS_ENABLED=true")
        return settings

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApnsSettings:
        reader = EnvReader(environ)
        settings = cls.read(reader)
        reader.finish()
        return settings


# No sender: what notify runs with unless ATELIER_APNS_ENABLED=true.
APNS_OFF = ApnsSettings(enabled=False, key_path="", key_id="", team_id="", bundle_id="")
