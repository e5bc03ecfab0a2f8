"""Assembles the creation service: servicers, database, media client, readiness.

One program, three roles: ``api`` serves the public and admin RPCs; ``worker`` runs the
job engine and listens only internally (health and reflection, for probes); ``all`` does
both (development, small deployments). Every role runs the outbox relay: each writes
outbox rows (submits and cancels in ``api``, every step of a job in ``worker``), so no
role's changes may wait for another role to be deployed, and replicas share the queue
(``SKIP LOCKED``) without stepping on each other. So does the webhook deliverer.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Mapping

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    queue_standing_service_pb2,
    queue_standing_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from services.creation.admin_servicer import AdminServicer
from services.creation.gauges import backlog_reading
from services.creation.jobs import Jobs
from services.creation.media_client import MediaClient
from services.creation.operators import Operators
from services.creation.providers.base import Provider
from services.creation.providers.registry import ProviderRegistry, RegistryError, build_registry
from services.creation.providers.stub import crash_point
from services.creation.ready_inputs import ReadyInputs
from services.creation.relay.notify_client import NotifyClient
from services.creation.relay.pruning import remote_prunings
from services.creation.relay.relay import OutboxRelay
from services.creation.remote.service import RemoteJobs
from services.creation.remote.servicer import WorkerServicer
from services.creation.servicer import CreationServicer
from services.creation.settings import CreationSettings
from services.creation.standing_servicer import QueueStandingServicer
from services.creation.store.catalog import CachedCatalog
from services.creation.store.jobs import SubmitLimits
from services.creation.waits import JobWaits
from services.creation.webhook_admin import WebhookOperators
from services.creation.webhook_rules import JobWebhookRule, UrlRule
from services.creation.webhooks.deliverer import WebhookDeliverer
from services.creation.worker.context import PointHook, no_point
from services.creation.worker.loop import Worker
from services.creation.worker.reaper import Reaper
from services.kit.addresses import AddressPolicy
from services.kit.auth import RoutedAuthenticator, ServiceAuthenticator, WorkerPoolAuthenticator
from services.kit.clock import Clock, system_clock
from services.kit.components import Component
from services.kit.db import Database
from services.kit.internal_tls import client_credentials
from services.kit.outages import classify
from services.kit.server import Binding, ServiceApp, TlsListener, run_service
from services.kit.settings import DatabaseSettings

ROLES = ("api", "worker", "all")


def components(
    settings: CreationSettings,
    database: Database,
    media: MediaClient,
    providers: Mapping[str, Provider],
    *,
    clock: Clock = system_clock,
    on_point: PointHook = no_point,
) -> list[Component]:
    """The background work of a worker process: the job worker (which owns its lease
    keeper) and the reaper. ``providers`` maps a catalog provider code to its adapter;
    ``on_point`` is called at each named point of an attempt (the stub's crash points)."""
    return [
        Worker(database.engine, media, providers, settings, clock=clock, on_point=on_point),
        Reaper(
            database.engine,
            providers,
            settings.reaper_period_seconds,
            clock=clock,
            media=media,
            auto_adopt=settings.auto_adopt_providers,
        ),
    ]


def _engine_components(
    settings: CreationSettings,
    database: Database,
    media: MediaClient,
    providers: Mapping[str, Provider] | None,
    clock: Clock,
    on_point: PointHook,
) -> list[Component]:
    if providers is None:
        # No provider registry wired in: the engine does not run (jobs stay queued).
        return []
    return components(settings, database, media, providers, clock=clock, on_point=on_point)


def _reading_deadline(limits: DatabaseSettings) -> float:
    """A reading waits for a pooled connection, then for its statement."""
    return limits.pool_timeout_seconds + limits.statement_timeout_seconds


async def _close_providers(providers: Mapping[str, Provider]) -> None:
    for provider in providers.values():
        await provider.close()


def build(
    settings: CreationSettings,
    role: str = "all",
    clock: Clock = system_clock,
    *,
    providers: Mapping[str, Provider] | None = None,
    on_point: PointHook = no_point,
) -> ServiceApp:
    """``providers`` (code → adapter) runs the job engine in roles worker and all; None
    leaves it out. The API's AdminService asks them what a job's provider holds
    (InspectJob, RESOLUTION_ADOPT's check)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    # Named by role: pg_stat_activity then tells the API's connections from the workers'.
    database = Database(
        settings.common.database_url, f"atelier-creation-{role}", limits=settings.common.database
    )
    tls = client_credentials(settings.common.internal_tls)
    media = MediaClient(
        settings.media_internal_address, settings.common.service_credential, tls=tls
    )
    notify = NotifyClient(
        settings.notify_internal_address,
        settings.common.service_credential,
        settings.relay.deliver_timeout_seconds,
        tls=tls,
    )
    relay = OutboxRelay(
        database.engine,
        notify,
        settings.relay,
        settings.common.database_url,
        clock=clock,
        prunings=remote_prunings(settings.remote.retention_seconds),
    )
    # Every role delivers webhooks too (replicas share the deliveries, SKIP LOCKED).
    webhooks = WebhookDeliverer(
        database.engine, media, settings.webhooks, settings.common.database_url
    )
    background = [
        *(
            _engine_components(settings, database, media, providers, clock, on_point)
            if role in ("worker", "all")
            else []
        ),
        relay,
        webhooks,
    ]
    if role in ("worker", "all"):
        # The roles that own the queue read its gauges (one replica's reading is the
        # whole database's: alert on max(), not sum()).
        background.append(
            backlog_reading(
                database.engine,
                settings.gauges_period_seconds,
                _reading_deadline(settings.common.database),
            )
        )
    cleanup = [media.close, notify.close, database.close]
    if providers is not None:
        cleanup.append(functools.partial(_close_providers, providers))
    if role == "worker":
        return ServiceApp(
            name="creation",
            public=[],
            internal=[],
            serve_public=False,
            readiness=database.answers,
            components=background,
            cleanup=cleanup,
        )
    # The API's waiting calls (WaitJob, Prefer: wait) share one LISTEN.
    waits = JobWaits(database.engine, settings.common.database_url)
    background.append(waits)
    limits = SubmitLimits(
        daily_quota=settings.daily_quota,
        in_flight_limit=settings.in_flight_limit,
        max_attempts=settings.max_attempts,
        welcome_points=settings.welcome_points,
    )
    jobs = Jobs(
        database.engine,
        media,
        limits,
        clock,
        ReadyInputs(settings.asset_cache_ttl_seconds, settings.asset_cache_size),
        waits,
    )
    worker_service = _worker_service(settings, database, media, clock)
    # Who may give SubmitJob a per-job webhook (and so own a signing key).
    webhook_identities = frozenset(
        i.name for i in settings.common.service_identities if i.per_job_webhooks
    )
    # https only, unless the deliverer may call plain http (ATELIER_WEBHOOK_ALLOW_HTTP).
    url_rule = UrlRule(
        allow_http=settings.webhooks.allow_http,
        addresses=AddressPolicy.allowing(settings.webhooks.allowed_networks),
    )
    return ServiceApp(
        name="creation",
        public=[
            Binding(
                creation_service_pb2.DESCRIPTOR.services_by_name["CreationService"],
                creation_service_pb2_grpc.add_CreationServiceServicer_to_server,
                CreationServicer(
                    CachedCatalog(database.engine, settings.catalog_ttl_seconds),
                    jobs,
                    JobWebhookRule(webhook_identities, url_rule),
                ),
            )
        ],
        internal=[
            Binding(
                admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"],
                admin_service_pb2_grpc.add_AdminServiceServicer_to_server,
                AdminServicer(
                    Operators(database.engine, settings.welcome_points, clock, providers),
                    WebhookOperators(database.engine, clock),
                    url_rule,
                    webhook_identities,
                ),
            ),
            Binding(
                queue_standing_service_pb2.DESCRIPTOR.services_by_name["QueueStandingService"],
                queue_standing_service_pb2_grpc.add_QueueStandingServiceServicer_to_server,
                QueueStandingServicer(jobs.queue_standing, clock),
            ),
            worker_service,
        ],
        internal_authenticator=_internal_authenticator(settings),
        tls=_remote_listener(settings, worker_service),
        readiness=database.answers,
        components=background,
        cleanup=cleanup,
    )


WORKER_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"]


def _worker_service(
    settings: CreationSettings, database: Database, media: MediaClient, clock: Clock
) -> Binding:
    """The remote worker protocol (docs/remote-workers.md)."""
    jobs = RemoteJobs(
        database.engine,
        media,
        settings.remote,
        clock,
        backoff_base_seconds=settings.backoff_base_seconds,
        backoff_max_seconds=settings.backoff_max_seconds,
    )
    return Binding(
        WORKER_SERVICE,
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server,
        WorkerServicer(jobs, clock),
    )


def _remote_listener(settings: CreationSettings, worker_service: Binding) -> TlsListener | None:
    """Remote workers outside the cluster: WorkerService (the same servicer as on the
    internal listener) and health over TLS, a pool's credential for every call; nothing
    else is served there (docs/remote-workers.md). Off without a certificate."""
    remote = settings.remote
    if remote.tls is None:
        return None
    return TlsListener(
        kind="remote",
        port=remote.tls_port,
        certificate=remote.tls,
        bindings=[worker_service],
        authenticator=WorkerPoolAuthenticator(dict(remote.pools_by_hash)),
    )


def _internal_authenticator(settings: CreationSettings) -> RoutedAuthenticator:
    """The service credential for every internal RPC but WorkerService's, which takes a
    worker pool's credential (and only that)."""
    return RoutedAuthenticator(
        ServiceAuthenticator(settings.common.service_token, settings.common.service_identities),
        {
            f"/{WORKER_SERVICE.full_name}/": WorkerPoolAuthenticator(
                dict(settings.remote.pools_by_hash)
            )
        },
    )


async def _catalog_problem(settings: CreationSettings, registry: ProviderRegistry) -> str | None:
    """Why this worker cannot serve the catalog (a model whose provider has no adapter, or
    a catalog it could not read), or None."""
    database = Database(
        settings.common.database_url, "atelier-creation", limits=settings.common.database
    )
    try:
        await registry.check_catalog(database.engine)
    except RegistryError as error:
        return str(error)
    except Exception as error:
        outage = classify(error)
        if outage is None:
            raise
        return f"cannot read the catalog to check its providers ({outage.kind}); try again"
    finally:
        await database.close()
    return None


def main(role: str = "all") -> int:
    settings = CreationSettings.from_env()
    # Every role has the adapters: workers run jobs with them, the API looks requests up.
    providers = build_registry(settings)
    on_point: PointHook = no_point
    if role in ("worker", "all"):
        problem = asyncio.run(_catalog_problem(settings, providers))
        if problem is not None:
            print(f"atelier serve creation: {problem}", file=sys.stderr)
            return 2
        if settings.stub.crash_at:
            on_point = functools.partial(crash_point, crash_at=settings.stub.crash_at)
    app = build(settings, role, providers=providers, on_point=on_point)
    return run_service(app, settings.common, settings.listen)
