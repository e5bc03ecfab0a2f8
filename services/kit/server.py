"""One server bootstrap for every service.

A service process has two gRPC listeners: the public one (end users, JWT bearer; the only
one the edge routes to) and the internal one (our own services, service credential).
Each has reflection and the standard health service. A service may add a third, over
TLS, for callers outside the cluster (creation's remote workers): only the services it
names and health, no reflection. Health follows a readiness probe
(it is not SERVING while the database is unreachable or too slow to answer).

Stop order: health NOT_SERVING → keep serving for the drain window (balancers notice and
route elsewhere) → stop the background components, each within its deadline → drain the
servers (``stop(grace)``) → cleanup (close pools).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.kit import event_loop, tracing
from services.kit.auth import Authenticator, JwtAuthenticator, Principal, ServiceAuthenticator
from services.kit.components import Component, Supervisor
from services.kit.delegation import PublicAuthenticator
from services.kit.interceptors import ServerStack, StackedServer
from services.kit.jwks import IssuerKeys
from services.kit.logging import configure as configure_logging
from services.kit.logging import get_logger
from services.kit.metrics import MetricsEndpoint, serve_metrics
from services.kit.outages import Throttle, classify, log_unavailable
from services.kit.ports import bind_grpc, bind_grpc_tls, listen_variable
from services.kit.reflection import enable_documented_reflection
from services.kit.settings import CommonSettings, ListenSettings
from services.kit.tls import ReloadingCertificate, ServerCertificateFiles
from services.kit.token_cache import VerifiedTokens

log = get_logger(__name__)

# A health service name for liveness probes: SERVING from start to the drain, whatever the
# readiness probe says. A liveness probe on "" would restart every replica while the
# database is down, which cures nothing; this one fails only when the process no longer
# answers at all (a wedged event loop, a dead server).
LIVENESS_SERVICE = "atelier.liveness"
# SERVING while every trusted issuer (ATELIER_JWT_ISSUERS) has usable signing keys. Kept
# apart from readiness: one identity provider's outage must not take the listeners out
# of the balancer (HS256 users, internal callers and cached keys still work).
IDENTITY_SERVICE = "atelier.identity"

# Sized for many long-lived streams and reconnect storms: grpc.aio cancels calls beyond
# its pending-call limit, so raise it; keepalives detect dead clients behind NATs.
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_concurrent_streams", 1000),
    # Calls that arrived but the application has not picked up yet: past the soft limit
    # (1,000 by default) gRPC cancels new ones (CANCELLED, no details), which a burst of
    # stream opens through one edge reaches at once.
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    # Between its soft (8 KiB) and hard (16 KiB) metadata limits gRPC refuses calls at
    # random; one limit makes the answer to a large header (a long token) the same each
    # time: checked by the service under 16 KiB, RESOURCE_EXHAUSTED over it.
    ("grpc.max_metadata_size", 16 * 1024),
    ("grpc.absolute_max_metadata_size", 16 * 1024),
    # gRPC sets SO_REUSEPORT by default: a second process would share a taken port.
    ("grpc.so_reuseport", 0),
]


@dataclass(frozen=True)
class Binding:
    """A servicer and the function that adds it to a server."""

    descriptor: ServiceDescriptor
    add_to_server: Callable[[Any, aio.Server], None]
    servicer: Any

    @property
    def name(self) -> str:
        return str(self.descriptor.full_name)


@dataclass(frozen=True)
class TlsListener:
    """A listener for callers outside the cluster: TLS with a certificate that is re-read
    when its files change (services.kit.tls), ``bindings`` and health only (anything
    else is UNIMPLEMENTED), no reflection. ``kind`` names its port's variable
    (``CREATION_<KIND>_PORT``)."""

    kind: str
    port: int
    certificate: ServerCertificateFiles
    bindings: Sequence[Binding]
    authenticator: Authenticator


@dataclass
class ServiceApp:
    """What a service contributes to the bootstrap."""

    name: str
    public: Sequence[Binding]
    internal: Sequence[Binding]
    # Says whether the service can do its job now (e.g. its database answers).
    readiness: Callable[[], Awaitable[bool]] | None = None
    # Background work (worker loops, relays, housekeeping); if one dies, the process stops.
    components: Sequence[Component] = ()
    # Runs after the servers stopped (close pools, engines).
    cleanup: Sequence[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # False for processes that only run components (creation --role worker): no public
    # listener at all; the internal one still answers health and reflection.
    serve_public: bool = True
    # Who may call the internal listener; None: the service credential alone.
    internal_authenticator: Authenticator | None = None
    # The TLS listener for outside callers; None: there is none.
    tls: TlsListener | None = None


def build_stack(
    service: str, authenticator: Authenticator, call_deadline_seconds: float | None = None
) -> ServerStack:
    """The RPC's span outermost (while tracing is on), then observability (it must see
    auth failures and every exception), then authentication, then the call's deadline,
    then the handler."""
    return ServerStack(
        service,
        authenticator,
        tracer=tracing.tracer(),
        call_deadline_seconds=call_deadline_seconds,
    )


class _Listener:
    def __init__(
        self,
        service: str,
        bindings: Sequence[Binding],
        authenticator: Authenticator,
        call_deadline_seconds: float,
        *,
        public: bool,
        reflection: bool = True,
    ):
        self.server = aio.server(options=SERVER_OPTIONS)
        # Everything registers through the stack: each handler is wrapped once, here.
        stack = build_stack(service, authenticator, call_deadline_seconds)
        stacked: Any = StackedServer(self.server, stack)
        # grpc-stubs predates the asyncio health servicer.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self.names = [b.name for b in bindings]
        for binding in bindings:
            binding.add_to_server(binding.servicer, stacked)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, stacked)
        if reflection:
            # The edge routes reflection to public listeners only (the whole public API).
            enable_documented_reflection(
                [*self.names, health.SERVICE_NAME], stacked, through_edge=public
            )

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.names]:
            await self.health.set(name, status)


class RunningService:
    """A started service; ``stop()`` drains and stops it."""

    def __init__(self, app: ServiceApp, common: CommonSettings, listen: ListenSettings) -> None:
        self.app = app
        self._common = common
        self._listen = listen
        self.user_authenticator = public_authenticator(common)
        self._public = (
            _Listener(
                app.name,
                app.public,
                PublicAuthenticator(self.user_authenticator, common.service_identities),
                common.call_deadline_seconds,
                public=True,
            )
            if app.serve_public
            else None
        )
        self._internal = _Listener(
            app.name,
            app.internal,
            app.internal_authenticator
            or ServiceAuthenticator(common.service_token, common.service_identities),
            common.call_deadline_seconds,
            public=False,
        )
        # Mutual TLS on the internal listener, when ATELIER_INTERNAL_TLS_* say so.
        self.internal_certificate = (
            ReloadingCertificate(common.internal_tls, "internal")
            if common.internal_tls is not None
            else None
        )
        self.tls_certificate: ReloadingCertificate | None = None
        self._tls: _Listener | None = None
        if app.tls is not None:
            # Loaded now: a certificate that went bad since the settings were read stops
            # the start (CertificateError is a SettingsError).
            self.tls_certificate = ReloadingCertificate(app.tls.certificate, app.tls.kind)
            self._tls = _Listener(
                app.name,
                app.tls.bindings,
                app.tls.authenticator,
                common.call_deadline_seconds,
                public=False,
                reflection=False,
            )
        self._listeners = [x for x in (self._public, self._internal, self._tls) if x is not None]
        self.public_port = 0
        self.internal_port = 0
        self.tls_port = 0
        self._readiness_task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[bool] | None = None
        self._probe_log = Throttle()
        self.components = Supervisor(app.components)
        self._metrics: MetricsEndpoint | None = None

    @property
    def failed(self) -> asyncio.Event:
        """Set when a component dies: the process must stop rather than limp on."""
        return self.components.failed

    @property
    def failure(self) -> BaseException | None:
        return self.components.failure

    async def start(self) -> None:
        host = self._common.host
        name = self.app.name
        if self._public is not None:
            self.public_port = bind_grpc(
                self._public.server, host, self._listen.public_port, listen_variable(name, "public")
            )
        if self.internal_certificate is None:
            self.internal_port = bind_grpc(
                self._internal.server,
                host,
                self._listen.internal_port,
                listen_variable(name, "internal"),
            )
        else:
            self.internal_port = bind_grpc_tls(
                self._internal.server,
                host,
                self._listen.internal_port,
                listen_variable(name, "internal"),
                self.internal_certificate.credentials(),
            )
        if self._tls is not None and self.app.tls is not None and self.tls_certificate:
            self.tls_port = bind_grpc_tls(
                self._tls.server,
                host,
                self.app.tls.port,
                listen_variable(name, self.app.tls.kind),
                self.tls_certificate.credentials(),
            )
        if self._listen.metrics_port:
            self._metrics = serve_metrics(
                host, self._listen.metrics_port, listen_variable(name, "metrics")
            )
        for listener in self._listeners:
            await listener.server.start()
        if self._public is not None and self.user_authenticator.keys is not None:
            self.user_authenticator.keys.start()
        await self._refresh_health()
        for listener in self._listeners:
            await listener.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._readiness_task = asyncio.create_task(self._watch_readiness(), name="readiness")
        self.components.start()
        log.info(
            "service_started",
            service=self.app.name,
            public_port=self.public_port,
            internal_port=self.internal_port,
            tls_port=self.tls_port or None,
            tls_not_after=(
                self.tls_certificate.current.not_after.isoformat() if self.tls_certificate else None
            ),
            metrics_port=self._listen.metrics_port,
            components=[c.name for c in self.app.components],
            event_loop=event_loop.running_loop_name(),
        )

    async def _ready(self) -> bool:
        if self.app.readiness is None:
            return True
        # A probe that overran is left to finish on its own rather than awaited: a
        # cancelled database call may itself wait on a server that does not answer.
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(_probe(self.app.readiness), name="readiness-probe")
            # An overrun probe's failure is the timeout already reported, not news.
            self._probe.add_done_callback(_retrieve)
        probe = self._probe
        await asyncio.wait({probe}, timeout=self._common.readiness_timeout_seconds)
        if not probe.done():
            # Not answering in time is as good as down (e.g. a frozen server).
            log_unavailable(self._probe_log, "readiness", "probe_timeout")
            return False
        error = probe.exception()
        if error is None:
            return probe.result()
        outage = classify(error)
        if outage is not None:
            log_unavailable(self._probe_log, outage.dependency, outage.kind, probe="readiness")
        elif self._probe_log.admit("readiness:unexpected") is not None:
            log.error(
                "readiness_probe_failed",
                service=self.app.name,
                error="".join(traceback.format_exception(error)),
            )
        return False

    async def _refresh_health(self) -> None:
        ready = await self._ready()
        # Without a public listener (creation --role worker) no user token is checked.
        keys = self.user_authenticator.keys if self._public is not None else None
        identity = (
            health_pb2.HealthCheckResponse.SERVING
            if keys is None or keys.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for listener in self._listeners:
            await listener.set_serving(ready)
            await listener.health.set(IDENTITY_SERVICE, identity)

    async def _watch_readiness(self) -> None:
        while True:
            await asyncio.sleep(self._common.readiness_period_seconds)
            await self._refresh_health()

    async def stop(self) -> None:
        common = self._common
        log.info(
            "service_draining",
            service=self.app.name,
            window_seconds=common.drain_window_seconds,
            grace_seconds=common.drain_grace_seconds,
        )
        # NOT_SERVING first, for good: the readiness loop can no longer change it.
        for listener in self._listeners:
            await listener.health.enter_graceful_shutdown()
        if self._readiness_task is not None:
            self._readiness_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._readiness_task
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()  # not awaited for long, for the reason in _ready
            await asyncio.wait({self._probe}, timeout=1.0)
        # Still serving: balancers that saw NOT_SERVING route new calls elsewhere meanwhile.
        await asyncio.sleep(common.drain_window_seconds)
        await self.components.stop(common.drain_grace_seconds)
        log.info("servers_draining", service=self.app.name)
        await asyncio.gather(
            *(listener.server.stop(common.drain_grace_seconds) for listener in self._listeners)
        )
        if self.user_authenticator.keys is not None:
            await self.user_authenticator.keys.stop()
        for cleanup in self.app.cleanup:
            await cleanup()
        if self._metrics is not None:
            # Last: a scrape during the drain still sees the final figures.
            await asyncio.to_thread(self._metrics.close)
        log.info("service_stopped", service=self.app.name)


def public_authenticator(common: CommonSettings) -> JwtAuthenticator:
    """Users: tokens of the trusted issuers, and HS256 self-minted ones unless off."""
    verified: VerifiedTokens[Principal] = VerifiedTokens()
    keys = (
        IssuerKeys(common.jwt_issuers, common.jwks, on_keys_dropped=verified.clear)
        if common.jwt_issuers
        else None
    )
    return JwtAuthenticator(
        common.jwt_secret,
        common.jwt_issuer,
        common.jwt_audience,
        common.jwt_max_lifetime_seconds,
        verified=verified,
        keys=keys,
    )


async def _probe(readiness: Callable[[], Awaitable[bool]]) -> bool:
    return await readiness()


def _retrieve(task: asyncio.Task[bool]) -> None:
    if not task.cancelled():
        task.exception()


async def serve_until_signalled(
    app: ServiceApp, common: CommonSettings, listen: ListenSettings
) -> int:
    """Runs the service until SIGTERM or SIGINT, then drains. Returns the exit code."""
    # Handlers first: a SIGTERM that arrives as soon as health says SERVING must drain,
    # not kill.
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    running = RunningService(app, common, listen)
    await running.start()
    signal_wait = asyncio.create_task(signalled.wait())
    failure_wait = asyncio.create_task(running.failed.wait())
    await asyncio.wait({signal_wait, failure_wait}, return_when=asyncio.FIRST_COMPLETED)
    signal_wait.cancel()
    failure_wait.cancel()
    await running.stop()
    return 1 if running.failure is not None else 0


def run_service(app: ServiceApp, common: CommonSettings, listen: ListenSettings) -> int:
    """The whole life of a service process: logs and traces, serve until signalled,
    drain, send the spans still buffered."""
    configure_logging(common.log_level, app.name)
    tracing.configure(common.tracing, app.name)
    try:
        return event_loop.run(serve_until_signalled(app, common, listen), common.event_loop)
    finally:
        tracing.shutdown()


def placeholder(base: Any) -> Any:
    """An instance of a generated servicer base class, whose every method answers
    UNIMPLEMENTED: the honest stand-in for RPCs that later work implements."""
    # Typed as Any: the generated stubs mark every servicer method abstract.
    return type(f"Unimplemented{base.__name__}", (base,), {})()
