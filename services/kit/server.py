"""One server bootstrap for every service.

A service process has two gRPC listeners: the public one (end users, JWT bearer; the only
one the edge routes to) and the internal one (our own services, service credential).
Each has reflection and the standard health service. Health follows a readiness probe
(it is not SERVING while the database is unreachable) and flips to NOT_SERVING before
the servers stop, so load balancers drain traffic first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.kit.auth import Authenticator, JwtAuthenticator, ServiceAuthenticator
from services.kit.interceptors import AuthInterceptor, ObservabilityInterceptor
from services.kit.logging import configure as configure_logging
from services.kit.logging import get_logger
from services.kit.metrics import serve_metrics
from services.kit.ports import bind_grpc, listen_variable
from services.kit.reflection import enable_documented_reflection
from services.kit.settings import CommonSettings, ListenSettings

log = get_logger(__name__)

# Sized for many long-lived streams and reconnect storms: grpc.aio cancels calls beyond
# its pending-call limit, so raise it; keepalives detect dead clients behind NATs.
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_concurrent_streams", 1000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    # gRPC sets SO_REUSEPORT by default: a second process would share a taken port.
    ("grpc.so_reuseport", 0),
]

READINESS_PERIOD_SECONDS = 5.0


@dataclass(frozen=True)
class Binding:
    """A servicer and the function that adds it to a server."""

    descriptor: ServiceDescriptor
    add_to_server: Callable[[Any, aio.Server], None]
    servicer: Any

    @property
    def name(self) -> str:
        return str(self.descriptor.full_name)


@dataclass
class ServiceApp:
    """What a service contributes to the bootstrap."""

    name: str
    public: Sequence[Binding]
    internal: Sequence[Binding]
    # Says whether the service can do its job now (e.g. its database answers).
    readiness: Callable[[], Awaitable[bool]] | None = None
    # Long-running tasks (worker loops, relays); if one dies, the process stops.
    background: Sequence[Callable[[], Awaitable[None]]] = ()
    # Runs after the servers stopped (close pools, engines).
    cleanup: Sequence[Callable[[], Awaitable[None]]] = field(default_factory=list)


def build_interceptors(
    service: str, authenticator: Authenticator
) -> list[aio.ServerInterceptor[Any, Any]]:
    # Outermost first: observability must see auth failures and every exception.
    return [ObservabilityInterceptor(service), AuthInterceptor(authenticator)]


class _Listener:
    def __init__(self, service: str, bindings: Sequence[Binding], authenticator: Authenticator):
        self.server = aio.server(
            interceptors=build_interceptors(service, authenticator), options=SERVER_OPTIONS
        )
        # grpc-stubs predates the asyncio health servicer.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self.names = [b.name for b in bindings]
        for binding in bindings:
            binding.add_to_server(binding.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_documented_reflection([*self.names, health.SERVICE_NAME], self.server)

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
        self._public = _Listener(
            app.name,
            app.public,
            JwtAuthenticator(common.jwt_secret, common.jwt_issuer, common.jwt_audience),
        )
        self._internal = _Listener(
            app.name, app.internal, ServiceAuthenticator(common.service_token)
        )
        self.public_port = 0
        self.internal_port = 0
        self._tasks: list[asyncio.Task[None]] = []
        # Set when a background task dies: the process must stop rather than limp on.
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    async def start(self) -> None:
        host = self._common.host
        name = self.app.name
        self.public_port = bind_grpc(
            self._public.server, host, self._listen.public_port, listen_variable(name, "public")
        )
        self.internal_port = bind_grpc(
            self._internal.server,
            host,
            self._listen.internal_port,
            listen_variable(name, "internal"),
        )
        if self._listen.metrics_port:
            serve_metrics(host, self._listen.metrics_port, listen_variable(name, "metrics"))
        await self._public.server.start()
        await self._internal.server.start()
        await self._refresh_health()
        self._tasks.append(asyncio.create_task(self._watch_readiness(), name="readiness"))
        for job in self.app.background:
            self._tasks.append(asyncio.create_task(self._supervise(job), name=job.__name__))
        log.info(
            "service_started",
            service=self.app.name,
            public_port=self.public_port,
            internal_port=self.internal_port,
            metrics_port=self._listen.metrics_port,
        )

    async def _refresh_health(self) -> None:
        ready = True
        if self.app.readiness is not None:
            try:
                ready = await self.app.readiness()
            except Exception:
                log.exception("readiness_probe_failed", service=self.app.name)
                ready = False
        await self._public.set_serving(ready)
        await self._internal.set_serving(ready)

    async def _watch_readiness(self) -> None:
        while True:
            await asyncio.sleep(READINESS_PERIOD_SECONDS)
            await self._refresh_health()

    async def _supervise(self, job: Callable[[], Awaitable[None]]) -> None:
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("background_task_died", service=self.app.name, task=job.__name__)
            self.failure = exc
            self.failed.set()

    async def stop(self) -> None:
        grace = self._common.drain_grace_seconds
        log.info("service_draining", service=self.app.name, grace_seconds=grace)
        await self._public.health.enter_graceful_shutdown()
        await self._internal.health.enter_graceful_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(self._public.server.stop(grace), self._internal.server.stop(grace))
        for cleanup in self.app.cleanup:
            await cleanup()
        log.info("service_stopped", service=self.app.name)


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
    """The whole life of a service process: logs, serve until signalled, drain."""
    configure_logging(common.log_level, app.name)
    return asyncio.run(serve_until_signalled(app, common, listen))


def placeholder(base: Any) -> Any:
    """An instance of a generated servicer base class, whose every method answers
    UNIMPLEMENTED: the honest stand-in for RPCs that later work implements."""
    # Typed as Any: the generated stubs mark every servicer method abstract.
    return type(f"Unimplemented{base.__name__}", (base,), {})()
