"""creation's settings: the common ones plus the job engine's knobs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.creation.providers.failures import FAILURES
from services.creation.remote.settings import RemoteSettings
from services.creation.webhooks.settings import WebhookSettings
from services.kit.settings import (
    DEFAULT_PORTS,
    CommonSettings,
    EnvReader,
    ListenSettings,
    require_service_credential,
)

# Where a test or a demo may kill a worker (see providers/stub/faults.py): the stub owns
# the first three, the worker the last three.
CRASH_POINTS = (
    "before_submit",
    "after_submit",
    "polling",
    "after_upload",
    "after_output",
    "before_complete",
)
STUB_CALLS = ("submit", "poll", "cancel")


@dataclass(frozen=True)
class StubFault:
    """An error code the stub answers on one call, ``times`` times (0: every time)."""

    call: str
    code: str
    times: int


@dataclass(frozen=True)
class StubSettings:
    """The stub provider's pace and its fault injection, for tests and demos."""

    duration_seconds: float = 3.0
    latency_seconds: float = 0.0
    state_dir: str = "./var/stub"
    ledger_path: str | None = None
    crash_at: str | None = None
    faults: tuple[StubFault, ...] = ()
    max_input_pixels: int = 40_000_000

    @classmethod
    def read(cls, reader: EnvReader) -> StubSettings:
        crash_at = reader.string("STUB_CRASH_AT", "", choices=CRASH_POINTS)
        ledger = reader.string("STUB_LEDGER", "")
        times = reader.integer("STUB_FAIL_TIMES", 0, minimum=0, maximum=1_000_000)
        faults = []
        for spec in reader.string("STUB_FAIL", "").split(","):
            if not spec.strip():
                continue
            call, _, code = (part.strip() for part in spec.partition(":"))
            reader.require(
                call in STUB_CALLS and code in FAILURES,
                "STUB_FAIL",
                f"must be call:CODE with call in {', '.join(STUB_CALLS)} and CODE in "
                f"{', '.join(FAILURES)} (got {spec.strip()!r})",
            )
            faults.append(StubFault(call, code, times))
        return cls(
            duration_seconds=reader.seconds("STUB_DURATION", 3.0, minimum=0, maximum=3600),
            latency_seconds=reader.seconds("STUB_LATENCY", 0.0, minimum=0, maximum=60),
            state_dir=reader.string("STUB_STATE_DIR", "./var/stub"),
            ledger_path=ledger or None,
            crash_at=crash_at or None,
            faults=tuple(faults),
            max_input_pixels=reader.integer(
                "STUB_MAX_INPUT_PIXELS", 40_000_000, minimum=1, maximum=89_478_485
            ),
        )


@dataclass(frozen=True)
class WorkerSettings:
    """The job engine's own knobs (ATELIER_WORKER_*)."""

    concurrency: int
    claim_batch: int
    poll_seconds: float
    provider_poll_seconds: float
    drain_seconds: float
    max_input_bytes: int
    # A PEM CA file trusted beside the system's for the signed object URLs (an edge or
    # object store with a private CA, as the dev overlay's self-signed edge); "" none.
    object_ca_file: str = ""
    # The local backend's signed URLs name the edge (what remote workers and clients
    # reach); this process's own transfers may go straight to media's object listener
    # instead: a URL under ``object_public_base_url`` is sent to the same path and query
    # under ``object_direct_base_url`` (the signature covers neither host nor port).
    # "" both: every URL as signed.
    object_public_base_url: str = ""
    object_direct_base_url: str = ""

    @classmethod
    def read(cls, reader: EnvReader) -> WorkerSettings:
        object_ca_file = reader.string("OBJECT_CA_FILE", "")
        reader.require(
            not object_ca_file or Path(object_ca_file).is_file(),
            "OBJECT_CA_FILE",
            f"names no file ({object_ca_file})",
        )
        public_base = reader.string("OBJECT_PUBLIC_BASE_URL", "").rstrip("/")
        direct_base = reader.string("OBJECT_DIRECT_BASE_URL", "").rstrip("/")
        reader.require(
            bool(public_base) == bool(direct_base),
            "OBJECT_DIRECT_BASE_URL",
            "goes with ATELIER_OBJECT_PUBLIC_BASE_URL: set both or neither",
        )
        for name, value in (
            ("OBJECT_PUBLIC_BASE_URL", public_base),
            ("OBJECT_DIRECT_BASE_URL", direct_base),
        ):
            reader.require(
                not value or value.startswith(("http://", "https://")),
                name,
                f"is not an http(s) URL ({value})",
            )
        return cls(
            # Attempts one process runs at once.
            concurrency=reader.integer("WORKER_CONCURRENCY", 8, minimum=1, maximum=256),
            # Jobs claimed per statement (never more than the free slots).
            claim_batch=reader.integer("WORKER_CLAIM_BATCH", 16, minimum=1, maximum=500),
            # The fallback look for due jobs when no NOTIFY came (retries whose backoff
            # ended, notifications lost while the LISTEN connection was down).
            poll_seconds=reader.seconds("WORKER_POLL", 2, minimum=0.05, maximum=300),
            # How often a running attempt asks its provider how it is going.
            provider_poll_seconds=reader.seconds(
                "WORKER_PROVIDER_POLL", 1, minimum=0.01, maximum=60
            ),
            # On SIGTERM, how long running attempts may take to finish before they are
            # handed back (never longer than ATELIER_DRAIN_GRACE allows).
            drain_seconds=reader.seconds("WORKER_DRAIN", 8, minimum=0, maximum=300),
            # The largest input image an attempt reads into memory.
            max_input_bytes=reader.byte_count(
                "WORKER_MAX_INPUT_BYTES", 20 * 1024 * 1024, minimum=1024, maximum=512 * 1024 * 1024
            ),
            object_ca_file=object_ca_file,
            object_public_base_url=public_base,
            object_direct_base_url=direct_base,
        )


# How an input photo reaches a vendor: inline as a data URI (works whatever the storage),
# or as media's short-lived signed URL (only when the vendor can reach the storage).
INPUT_MODES = ("inline", "url")
# Provider codes whose calls the worker limits per process (providers/limits.py).
LIMITED_PROVIDERS = ("stub", "replicate", "fal")


@dataclass(frozen=True)
class ProviderLimit:
    """One provider's share of a worker process: at most ``max_in_flight`` requests from
    submit to the end of polling, and submits at ``rate_per_second`` with bursts of
    ``burst``. 0 turns either off."""

    max_in_flight: int = 0
    rate_per_second: float = 0.0
    burst: int = 1

    @classmethod
    def read(cls, reader: EnvReader, code: str, default: ProviderLimit) -> ProviderLimit:
        prefix = code.upper()
        return cls(
            max_in_flight=reader.integer(
                f"{prefix}_MAX_IN_FLIGHT", default.max_in_flight, minimum=0, maximum=10_000
            ),
            rate_per_second=reader.seconds(
                f"{prefix}_RATE", default.rate_per_second, minimum=0, maximum=10_000
            ),
            burst=reader.integer(f"{prefix}_BURST", default.burst, minimum=1, maximum=10_000),
        )


_DEFAULT_LIMITS = {
    "stub": ProviderLimit(),
    # Replicate creates predictions at 600 a minute per account (its rate-limits page):
    # a few processes at 5 a second stay under it.
    "replicate": ProviderLimit(max_in_flight=16, rate_per_second=5.0, burst=10),
    "fal": ProviderLimit(max_in_flight=10, rate_per_second=5.0, burst=10),
}


@dataclass(frozen=True)
class VendorSettings:
    """One hosted vendor: where its API is and our key for it (empty: not configured).
    The key is a secret: never in a repr, a log line or an error."""

    base_url: str
    api_key: str = field(default="", repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.api_key)


@dataclass(frozen=True)
class ProviderSettings:
    """The vendor adapters' settings (ATELIER_REPLICATE_*, ATELIER_FAL_*, ATELIER_PROVIDER_*)
    and every provider's per-process limits."""

    replicate: VendorSettings = VendorSettings("https://api.replicate.com")
    fal: VendorSettings = VendorSettings("https://queue.fal.run")
    input_mode: str = "inline"
    output_max_bytes: int = 30 * 1024 * 1024
    connect_timeout_seconds: float = 5.0
    request_timeout_seconds: float = 30.0
    download_timeout_seconds: float = 60.0
    limits: dict[str, ProviderLimit] = field(default_factory=lambda: dict(_DEFAULT_LIMITS))

    @classmethod
    def read(cls, reader: EnvReader) -> ProviderSettings:
        return cls(
            replicate=VendorSettings(
                base_url=_base_url(reader, "REPLICATE_BASE_URL", "https://api.replicate.com"),
                api_key=reader.secret("REPLICATE_API_TOKEN", "", min_length=16),
            ),
            fal=VendorSettings(
                base_url=_base_url(reader, "FAL_QUEUE_URL", "https://queue.fal.run"),
                api_key=reader.secret("FAL_KEY", "", min_length=16),
            ),
            # "url" only when the vendors can fetch media's signed URLs (S3 or a public
            # media host); local storage in dev is reachable by nobody outside.
            input_mode=reader.string("PROVIDER_INPUT", "inline", choices=INPUT_MODES),
            output_max_bytes=reader.byte_count(
                "PROVIDER_OUTPUT_MAX_BYTES",
                30 * 1024 * 1024,
                minimum=1024,
                maximum=512 * 1024 * 1024,
            ),
            connect_timeout_seconds=reader.seconds(
                "PROVIDER_CONNECT_TIMEOUT", 5, minimum=0.1, maximum=120
            ),
            # Per call: the longest a vendor may take to answer one request.
            request_timeout_seconds=reader.seconds(
                "PROVIDER_REQUEST_TIMEOUT", 30, minimum=0.1, maximum=600
            ),
            download_timeout_seconds=reader.seconds(
                "PROVIDER_DOWNLOAD_TIMEOUT", 60, minimum=0.1, maximum=3600
            ),
            limits={
                code: ProviderLimit.read(reader, code, _DEFAULT_LIMITS[code])
                for code in LIMITED_PROVIDERS
            },
        )


def _base_url(reader: EnvReader, name: str, default: str) -> str:
    value = reader.string(name, default).rstrip("/")
    reader.require(
        value.startswith(("https://", "http://")), name, "must be an http:// or https:// URL"
    )
    return value


RELAY_FAULTS = ("duplicate_reversed",)


@dataclass(frozen=True)
class RelaySettings:
    """The outbox relay's knobs (ATELIER_RELAY_*)."""

    batch: int = 200
    poll_seconds: float = 1.0
    backoff_base_seconds: float = 0.1
    backoff_max_seconds: float = 2.0
    deliver_timeout_seconds: float = 5.0
    retention_seconds: float = 86400.0
    prune_period_seconds: float = 60.0
    fault: str | None = None
    round_spacing_seconds: float = 0.05

    @classmethod
    def read(cls, reader: EnvReader) -> RelaySettings:
        fault = reader.string("RELAY_FAULT", "", choices=RELAY_FAULTS)
        return cls(
            # Outbox rows delivered per Deliver call.
            batch=reader.integer("RELAY_BATCH", 200, minimum=1, maximum=1000),
            # The fallback look for rows when no NOTIFY came (one lost while the LISTEN
            # connection was down).
            poll_seconds=reader.seconds("RELAY_POLL", 1, minimum=0.05, maximum=300),
            # While notify is down: the first retry's ceiling, doubling up to the maximum
            # (full jitter). The maximum bounds how long notify waits, once back, for news.
            backoff_base_seconds=reader.seconds(
                "RELAY_BACKOFF_BASE", 0.1, minimum=0.01, maximum=60
            ),
            backoff_max_seconds=reader.seconds("RELAY_BACKOFF_MAX", 2, minimum=0.05, maximum=300),
            deliver_timeout_seconds=reader.seconds(
                "RELAY_DELIVER_TIMEOUT", 5, minimum=0.1, maximum=60
            ),
            # How long delivered rows stay (for operators and replays) before pruning.
            retention_seconds=reader.seconds(
                "RELAY_RETENTION", 86400, minimum=0, maximum=90 * 86400
            ),
            prune_period_seconds=reader.seconds(
                "RELAY_PRUNE_PERIOD", 60, minimum=0.05, maximum=86400
            ),
            # Tests only: deliver every batch twice, reversed and late (see relay/faults.py).
            fault=fault or None,
            # Rounds start at most this often: under load, rows wait up to this long and
            # go to notify together (one Deliver, one transaction there, for many rows);
            # a row after a quiet spell goes at once.
            round_spacing_seconds=reader.seconds("RELAY_ROUND_SPACING", 0.05, minimum=0, maximum=1),
        )


# Automatic recovery is on for the stub (its lookup is exact) and off for the hosted
# vendors, whose adapters cannot look a request up by our reference at all.
AUTO_ADOPT_DEFAULT = frozenset({"stub"})
# The adapters whose lookup may be trusted to adopt without a person.
AUTO_ADOPT_CAPABLE = ("stub",)


def _auto_adopt(reader: EnvReader) -> frozenset[str]:
    """ATELIER_AUTO_ADOPT: comma-separated provider codes, or "none"."""
    raw = reader.string("AUTO_ADOPT", ",".join(sorted(AUTO_ADOPT_DEFAULT))).strip()
    if raw.lower() in ("", "none"):
        return frozenset()
    codes = frozenset(code.strip() for code in raw.split(",") if code.strip())
    unable = sorted(codes - set(AUTO_ADOPT_CAPABLE))
    reader.require(
        not unable,
        "AUTO_ADOPT",
        f"names providers whose adapter cannot look requests up ({', '.join(unable)});"
        f" capable: {', '.join(AUTO_ADOPT_CAPABLE)}, or none",
    )
    return codes & frozenset(AUTO_ADOPT_CAPABLE)


@dataclass(frozen=True)
class CreationSettings:
    common: CommonSettings
    listen: ListenSettings
    media_internal_address: str
    notify_internal_address: str
    lease_ttl_seconds: float
    heartbeat_seconds: float
    progress_seconds: float
    reaper_period_seconds: float
    # How often the worker and all roles read the queue, attention and outbox gauges.
    gauges_period_seconds: float
    backoff_base_seconds: float
    backoff_max_seconds: float
    max_attempts: int
    daily_quota: int
    in_flight_limit: int
    welcome_points: int
    catalog_ttl_seconds: float
    asset_cache_ttl_seconds: float
    asset_cache_size: int
    worker: WorkerSettings
    stub: StubSettings = StubSettings()
    relay: RelaySettings = RelaySettings()
    providers: ProviderSettings = ProviderSettings()
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    # The provider codes whose NEEDS_ATTENTION jobs the reaper adopts on its own when the
    # adapter's lookup finds exactly one request for the job (ATELIER_AUTO_ADOPT).
    auto_adopt_providers: frozenset[str] = AUTO_ADOPT_DEFAULT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CreationSettings:
        reader = EnvReader(environ)
        media_port = DEFAULT_PORTS["media"].internal_port
        notify_port = DEFAULT_PORTS["notify"].internal_port
        common = CommonSettings.read(reader)
        settings = cls(
            common=common,
            listen=ListenSettings.read(reader, "creation", DEFAULT_PORTS["creation"]),
            media_internal_address=reader.string(
                "MEDIA_INTERNAL_ADDRESS", f"127.0.0.1:{media_port}"
            ),
            notify_internal_address=reader.string(
                "NOTIFY_INTERNAL_ADDRESS", f"127.0.0.1:{notify_port}"
            ),
            lease_ttl_seconds=reader.seconds("LEASE_TTL", 60, minimum=5, maximum=3600),
            heartbeat_seconds=reader.seconds("HEARTBEAT", 10, minimum=0.5, maximum=600),
            # How often a running job's changed progress is written (a version and an
            # update to watchers each); never less often than the heartbeat.
            progress_seconds=reader.seconds("PROGRESS_INTERVAL", 1, minimum=0.1, maximum=600),
            reaper_period_seconds=reader.seconds("REAPER_PERIOD", 15, minimum=0.5, maximum=600),
            gauges_period_seconds=reader.seconds("GAUGES_PERIOD", 15, minimum=0.05, maximum=600),
            backoff_base_seconds=reader.seconds("BACKOFF_BASE", 2, minimum=0.1, maximum=600),
            backoff_max_seconds=reader.seconds("BACKOFF_MAX", 300, minimum=1, maximum=86400),
            max_attempts=reader.integer("MAX_ATTEMPTS", 3, minimum=1, maximum=20),
            daily_quota=reader.integer("DAILY_QUOTA", 50, minimum=1, maximum=100_000),
            in_flight_limit=reader.integer("IN_FLIGHT_LIMIT", 3, minimum=1, maximum=1000),
            # Points a user starts with, granted once when first seen; 0 turns it off.
            welcome_points=reader.integer("WELCOME_POINTS", 100, minimum=0, maximum=1_000_000),
            # How long ListCatalog may serve its in-process copy; a catalog edit shows
            # within this long. 0 reads the database every time.
            catalog_ttl_seconds=reader.seconds("CATALOG_TTL", 5, minimum=0, maximum=3600),
            # How long an input asset media called ready and the user's own is trusted
            # without asking media again; a deletion within it fails the job at the worker
            # (INPUT_UNREADABLE). 0 asks media on every submit.
            asset_cache_ttl_seconds=reader.seconds("ASSET_CACHE_TTL", 30, minimum=0, maximum=3600),
            asset_cache_size=reader.integer(
                "ASSET_CACHE_SIZE", 10_000, minimum=0, maximum=10_000_000
            ),
            worker=WorkerSettings.read(reader),
            stub=StubSettings.read(reader),
            relay=RelaySettings.read(reader),
            providers=ProviderSettings.read(reader),
            remote=RemoteSettings.read(reader),
            webhooks=WebhookSettings.read(reader, common.env),
            auto_adopt_providers=_auto_adopt(reader),
        )
        # A heartbeat must come well inside the lease, or live jobs would be reaped.
        reader.require(
            settings.heartbeat_seconds * 2 <= settings.lease_ttl_seconds,
            "HEARTBEAT",
            f"must be at most half of ATELIER_LEASE_TTL ({settings.lease_ttl_seconds:g}s)",
        )
        reader.require(
            settings.backoff_base_seconds <= settings.backoff_max_seconds,
            "BACKOFF_BASE",
            "must not exceed ATELIER_BACKOFF_MAX",
        )
        reader.require(
            settings.relay.backoff_base_seconds <= settings.relay.backoff_max_seconds,
            "RELAY_BACKOFF_BASE",
            "must not exceed ATELIER_RELAY_BACKOFF_MAX",
        )
        require_service_credential(reader, settings.common, "media and notify")
        reader.finish()
        return settings
