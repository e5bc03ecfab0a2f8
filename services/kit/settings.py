"""Typed settings read from ``ATELIER_*`` environment variables.

Every knob has a default and bounds. A bad value stops the process before it serves
anything, with a message that names the variable, so a typo never becomes a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.kit.event_loop import DEFAULT_EVENT_LOOP, EVENT_LOOPS
from services.kit.identities import ServiceIdentity, holder, read_identities
from services.kit.issuers import JwksBounds, TrustedIssuer, read_issuers
from services.kit.sizes import byte_size

if TYPE_CHECKING:
    from services.kit.tls import ServerCertificateFiles

PREFIX = "ATELIER_"

# Development-only credentials. They let `atelier dev` and the tests run with no setup;
# ATELIER_ENV=prod refuses to start while either is still in use.
DEV_JWT_SECRET = "atelier-dev-jwt-secret-not-for-production"
DEV_SERVICE_TOKEN = "atelier-dev-service-token-not-for-production"


class SettingsError(Exception):
    """One or more settings are invalid; the message lists every one of them."""


class EnvReader:
    """Reads and checks variables, collecting every problem before reporting them."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._problems: list[str] = []

    def _raw(self, name: str) -> str | None:
        value = self._environ.get(PREFIX + name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def _problem(self, name: str, message: str) -> None:
        self._problems.append(f"{PREFIX}{name} {message}")

    def string(self, name: str, default: str, *, choices: tuple[str, ...] = ()) -> str:
        value = self._raw(name)
        if value is None:
            return default
        if choices and value not in choices:
            self._problem(name, f"must be one of {', '.join(choices)} (got {value!r})")
            return default
        return value

    def postgres_url(self, name: str, default: str) -> str:
        """A PostgreSQL URL (postgresql:// or postgres://, host or ?host=socket dir)."""
        value = self._raw(name)
        if value is None:
            return default
        scheme = value.partition("://")[0]
        if scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
            # The value may hold a password: name the scheme only.
            self._problem(name, f"must be a postgresql:// URL (got a {scheme or 'bare'} value)")
            return default
        return value

    def secret(self, name: str, default: str, *, min_length: int = 16) -> str:
        """Like string, but the value never appears in a message."""
        value = self._raw(name)
        if value is None:
            return default
        if len(value) < min_length:
            self._problem(name, f"must be at least {min_length} characters long")
            return default
        return value

    def integer(self, name: str, default: int, *, minimum: int, maximum: int) -> int:
        return self._whole(name, default, minimum, maximum, str)

    def byte_count(self, name: str, default: int, *, minimum: int, maximum: int) -> int:
        """A size in bytes, whose bounds a bad value is told in KiB and MiB."""
        return self._whole(name, default, minimum, maximum, byte_size, " bytes")

    def _whole(
        self,
        name: str,
        default: int,
        minimum: int,
        maximum: int,
        said: Callable[[int], str],
        unit: str = "",
    ) -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            of_unit = f" of{unit}" if unit else ""
            self._problem(name, f"must be a whole number{of_unit} (got {value!r})")
            return default
        if not minimum <= number <= maximum:
            within = f"between {said(minimum)} and {said(maximum)}"
            self._problem(name, f"must be {within} (got {number}{unit})")
            return default
        return number

    def seconds(self, name: str, default: float, *, minimum: float, maximum: float) -> float:
        return self._real(
            name,
            default,
            (minimum, maximum),
            "a number of seconds",
            f"between {minimum:g} and {maximum:g} seconds",
        )

    def ratio(self, name: str, default: float) -> float:
        """A fraction from 0 to 1."""
        return self._real(name, default, (0.0, 1.0), "a number from 0 to 1", "from 0 to 1")

    def _real(
        self, name: str, default: float, bounds: tuple[float, float], kind: str, within: str
    ) -> float:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            self._problem(name, f"must be {kind} (got {value!r})")
            return default
        if not bounds[0] <= number <= bounds[1]:
            self._problem(name, f"must be {within} (got {value})")
            return default
        return number

    def require(self, condition: bool, name: str, message: str) -> None:
        """Records a rule that spans several values."""
        if not condition:
            self._problem(name, message)

    def finish(self) -> None:
        if self._problems:
            raise SettingsError("invalid settings:\n  " + "\n  ".join(self._problems))


def port(reader: EnvReader, name: str, default: int) -> int:
    return reader.integer(name, default, minimum=1, maximum=65535)


DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/atelier"


def database_url(reader: EnvReader) -> str:
    return reader.postgres_url("DATABASE_URL", DEFAULT_DATABASE_URL)


def connect_timeout(reader: EnvReader) -> float:
    return reader.seconds("DB_CONNECT_TIMEOUT", 1.5, minimum=0.1, maximum=120)


@dataclass(frozen=True)
class DatabaseSettings:
    """Deadlines for every way a database call can wait. A server that is down or frozen
    must cost a caller seconds, not its whole deadline; a frozen server cannot enforce
    its own statement_timeout, so the client times every statement out too."""

    statement_timeout_seconds: float = 2.0
    lock_timeout_seconds: float = 1.0
    pool_timeout_seconds: float = 2.0
    connect_timeout_seconds: float = 1.5
    pool_size: int = 20

    @classmethod
    def read(cls, reader: EnvReader) -> DatabaseSettings:
        settings = cls(
            statement_timeout_seconds=reader.seconds(
                "DB_STATEMENT_TIMEOUT", 2.0, minimum=0.1, maximum=600
            ),
            lock_timeout_seconds=reader.seconds("DB_LOCK_TIMEOUT", 1.0, minimum=0.05, maximum=600),
            pool_timeout_seconds=reader.seconds("DB_POOL_TIMEOUT", 2.0, minimum=0.05, maximum=600),
            connect_timeout_seconds=connect_timeout(reader),
            pool_size=reader.integer("DB_POOL_SIZE", 20, minimum=1, maximum=500),
        )
        reader.require(
            settings.lock_timeout_seconds <= settings.statement_timeout_seconds,
            "DB_LOCK_TIMEOUT",
            "must not exceed ATELIER_DB_STATEMENT_TIMEOUT",
        )
        return settings


@dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry traces (ATELIER_OTEL_*): off by default; ``otlp`` sends spans to an
    OTLP/gRPC collector (an http:// endpoint is plaintext, https:// TLS)."""

    exporter: str = "none"
    endpoint: str = "http://127.0.0.1:4317"
    # Of the traces that start here (a caller's sampling decision always stands).
    sample_ratio: float = 1.0
    # How long spans wait in the batch before they are sent, and a send's deadline.
    export_delay_seconds: float = 5.0
    export_timeout_seconds: float = 5.0

    @classmethod
    def read(cls, reader: EnvReader) -> TracingSettings:
        settings = cls(
            exporter=reader.string("OTEL_EXPORTER", "none", choices=("none", "otlp")),
            endpoint=reader.string("OTEL_ENDPOINT", cls.endpoint),
            sample_ratio=reader.ratio("OTEL_SAMPLE_RATIO", 1.0),
            export_delay_seconds=reader.seconds("OTEL_EXPORT_DELAY", 5.0, minimum=0.01, maximum=60),
            export_timeout_seconds=reader.seconds(
                "OTEL_EXPORT_TIMEOUT", 5.0, minimum=0.1, maximum=60
            ),
        )
        reader.require(
            settings.endpoint.startswith(("http://", "https://")),
            "OTEL_ENDPOINT",
            "must be an http:// or https:// URL of an OTLP/gRPC collector",
        )
        return settings


@dataclass(frozen=True)
class CommonSettings:
    """What every service process needs."""

    env: str
    host: str
    database_url: str
    # The HS256 key of self-minted tokens (`make dev`, deployments that mint their own);
    # "" when HS256 is off (prod with trusted issuers and no ATELIER_JWT_SECRET).
    jwt_secret: str
    jwt_issuer: str
    jwt_audience: str
    # The longest a user token may be valid (exp - iat); longer ones are refused.
    jwt_max_lifetime_seconds: float
    # The shared internal credential that may call every internal RPC (backward
    # compatible, `make dev`); "" when it is off (prod with ATELIER_SERVICE_IDENTITIES).
    service_token: str
    log_level: str
    drain_grace_seconds: float
    # uvloop or asyncio (services/kit/event_loop.py).
    event_loop: str = DEFAULT_EVENT_LOOP
    # After SIGTERM: how long the listeners keep serving while health says NOT_SERVING,
    # so load balancers stop routing here before connections are refused.
    drain_window_seconds: float = 0.0
    # The readiness probe runs every period and counts as failed after its timeout:
    # health follows the database within period + timeout.
    readiness_period_seconds: float = 1.0
    readiness_timeout_seconds: float = 1.5
    # The longest any call may take before it answers (UNAVAILABLE when it is still
    # waiting, e.g. for a frozen database); a client's shorter deadline wins.
    call_deadline_seconds: float = 3.0
    database: DatabaseSettings = DatabaseSettings()
    tracing: TracingSettings = TracingSettings()
    # The app's identity providers (ATELIER_JWT_ISSUERS) and how their keys are kept.
    jwt_issuers: tuple[TrustedIssuer, ...] = ()
    jwks: JwksBounds = field(default_factory=JwksBounds)
    # Who may call the internal listeners, each with its own credential and policy.
    service_identities: tuple[ServiceIdentity, ...] = ()
    # What this process sends to its peers' internal listeners (its own identity's
    # credential; the shared token when unset).
    service_credential: str = ""
    # Mutual TLS on the internal listeners and their clients (ATELIER_INTERNAL_TLS_*);
    # None: plaintext.
    internal_tls: ServerCertificateFiles | None = None

    @classmethod
    def read(cls, reader: EnvReader) -> CommonSettings:
        env = reader.string("ENV", "dev", choices=("dev", "test", "prod"))
        jwt_issuer = reader.string("JWT_ISSUER", "atelier")
        jwt_issuers = read_issuers(reader, jwt_issuer)
        # In prod an identity provider alone is enough: without a secret, HS256 is off
        # and nobody holds a key that signs users.
        hs256_default = "" if env == "prod" and jwt_issuers else DEV_JWT_SECRET
        identities = read_identities(reader)
        # With per-service identities the shared all-powerful token is off unless set
        # explicitly (the dev stack sets the development one, for tools and old tests).
        shared_default = "" if identities else DEV_SERVICE_TOKEN
        service_token = reader.secret("SERVICE_TOKEN", shared_default, min_length=32)
        settings = cls(
            env=env,
            host=reader.string("HOST", "127.0.0.1"),
            database_url=database_url(reader),
            jwt_secret=reader.secret("JWT_SECRET", hs256_default, min_length=32),
            jwt_issuer=jwt_issuer,
            jwt_audience=reader.string("JWT_AUDIENCE", "atelier-app"),
            jwt_max_lifetime_seconds=reader.seconds(
                "JWT_MAX_LIFETIME", 24 * 3600, minimum=60, maximum=30 * 24 * 3600
            ),
            service_token=service_token,
            log_level=reader.string(
                "LOG_LEVEL", "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
            ),
            drain_grace_seconds=reader.seconds("DRAIN_GRACE", 10.0, minimum=0, maximum=300),
            event_loop=reader.string("EVENT_LOOP", DEFAULT_EVENT_LOOP, choices=EVENT_LOOPS),
            drain_window_seconds=reader.seconds(
                "DRAIN_WINDOW", 5.0 if env == "prod" else 0.0, minimum=0, maximum=120
            ),
            readiness_period_seconds=reader.seconds(
                "READINESS_PERIOD", 1.0, minimum=0.1, maximum=60
            ),
            readiness_timeout_seconds=reader.seconds(
                "READINESS_TIMEOUT", 1.5, minimum=0.1, maximum=60
            ),
            call_deadline_seconds=reader.seconds("CALL_DEADLINE", 3.0, minimum=0.1, maximum=120),
            database=DatabaseSettings.read(reader),
            tracing=TracingSettings.read(reader),
            jwt_issuers=jwt_issuers,
            jwks=JwksBounds.read(reader),
            service_identities=identities,
            service_credential=reader.secret("SERVICE_CREDENTIAL", service_token, min_length=32),
            internal_tls=_internal_tls(reader),
        )
        _check_own_credential(reader, settings)
        if env == "prod":
            reader.require(
                settings.jwt_secret != DEV_JWT_SECRET,
                "JWT_SECRET",
                "must be set in prod (or left unset with ATELIER_JWT_ISSUERS: HS256 off)",
            )
            reader.require(
                settings.service_token != DEV_SERVICE_TOKEN,
                "SERVICE_TOKEN",
                "must be set in prod (or left unset with ATELIER_SERVICE_IDENTITIES)",
            )
            reader.require(
                settings.service_credential != DEV_SERVICE_TOKEN,
                "SERVICE_CREDENTIAL",
                "must not be the development credential in prod",
            )
        return settings


def _internal_tls(reader: EnvReader) -> ServerCertificateFiles | None:
    # Imported here: services.kit.tls reads its settings through this module.
    from services.kit.internal_tls import read_internal_tls

    return read_internal_tls(reader)


def _check_own_credential(reader: EnvReader, settings: CommonSettings) -> None:
    """A process whose own credential no peer would accept is refused at start, not at its
    first call (the identities are the same setting in every service)."""
    own = settings.service_credential
    if not settings.service_identities or not own or own == settings.service_token:
        return
    reader.require(
        holder(settings.service_identities, own) is not None,
        "SERVICE_CREDENTIAL",
        "matches no identity of ATELIER_SERVICE_IDENTITIES (its SHA-256 is not listed)",
    )


def require_service_credential(reader: EnvReader, common: CommonSettings, calls: str) -> None:
    """For a service that calls its peers' internal listeners."""
    reader.require(
        bool(common.service_credential),
        "SERVICE_CREDENTIAL",
        f"must be set: this service calls {calls} (or set ATELIER_SERVICE_TOKEN)",
    )


@dataclass(frozen=True)
class MigrationSettings:
    """What `atelier migrate` reads, in every environment: the database and how long to
    wait for it. The migration Job holds no service secret, so it reads none; the services
    still refuse to start without theirs (CommonSettings)."""

    database_url: str
    connect_timeout_seconds: float

    @classmethod
    def read(cls, reader: EnvReader) -> MigrationSettings:
        return cls(
            database_url=database_url(reader), connect_timeout_seconds=connect_timeout(reader)
        )


@dataclass(frozen=True)
class ListenSettings:
    """The three ports of one service: public gRPC, internal gRPC and Prometheus metrics."""

    public_port: int
    internal_port: int
    metrics_port: int

    @classmethod
    def read(cls, reader: EnvReader, service: str, defaults: ListenSettings) -> ListenSettings:
        key = service.upper()
        return cls(
            public_port=port(reader, f"{key}_PUBLIC_PORT", defaults.public_port),
            internal_port=port(reader, f"{key}_INTERNAL_PORT", defaults.internal_port),
            metrics_port=port(reader, f"{key}_METRICS_PORT", defaults.metrics_port),
        )


# Default ports, one block per service; `atelier dev` and deploy/envoy/envoy.yaml agree.
DEFAULT_PORTS: dict[str, ListenSettings] = {
    "creation": ListenSettings(public_port=50051, internal_port=50061, metrics_port=9461),
    "media": ListenSettings(public_port=50052, internal_port=50062, metrics_port=9462),
    "notify": ListenSettings(public_port=50053, internal_port=50063, metrics_port=9463),
}
