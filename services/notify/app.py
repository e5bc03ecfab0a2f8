"""Assembles the notify service: the ingest listener (creation's relay delivers job states
to the projection, delivery.py; what moved goes to the streams' fan-out: this replica's
streams, and through Redis every other's when configured), the client streams with their
backstop, the job feed for internal services (feed_servicer.py, on the internal listener),
operators' list of failed pushes (admin_servicer.py, internal too) and the APNs token
RPCs (devices.py); Deliver records the pushes each update implies
(services/notify/pushes/), and with APNs configured the sender drains them
(services/notify/apns/). All SQL is in services/notify/store/."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from atelier.notify.v1 import (
    notify_admin_service_pb2,
    notify_admin_service_pb2_grpc,
    notify_feed_service_pb2,
    notify_feed_service_pb2_grpc,
    notify_ingest_service_pb2,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2,
    notify_service_pb2_grpc,
)
from services.kit.components import Component
from services.kit.db import Database
from services.kit.internal_tls import client_credentials
from services.kit.server import Binding, ServiceApp, run_service
from services.notify.admin_servicer import NotifyAdminServicer
from services.notify.apns.assemble import build_sender
from services.notify.delivery import Delivery, Publisher
from services.notify.devices import Devices
from services.notify.feed_servicer import FeedServicer
from services.notify.ingest_servicer import NotifyIngestServicer
from services.notify.output_urls import MediaSigner, OutputUrls
from services.notify.pushes.planner import PushPlanner
from services.notify.pushes.planning import Rules
from services.notify.queue_standings import CreationStandings
from services.notify.servicer import NotifyServicer
from services.notify.settings import NotifySettings
from services.notify.store import (
    FailedPushReads,
    FeedReads,
    ProjectionStore,
    StreamReads,
    TokenStore,
)
from services.notify.streams.backstop import Backstop
from services.notify.streams.change import Change, Snapshot
from services.notify.streams.clock import StreamClock
from services.notify.streams.drain import StreamDrain
from services.notify.streams.fanout import LocalFanout, RedisFanout
from services.notify.streams.first_states import FirstStates
from services.notify.streams.registry import StreamRegistry, Watched
from services.notify.streams.standings import Fetch, Standings


@dataclass
class Streams:
    """The streams' parts, for the app and for tests that drive them directly."""

    registry: StreamRegistry
    publisher: Publisher
    components: list[Component]
    redis: RedisFanout | None
    backstop: Backstop
    standings: Standings


def build_streams(settings: NotifySettings, database: Database, fetch: Fetch) -> Streams:
    """``fetch``: where the queued jobs the streams watch stand (creation's answer)."""
    registry = StreamRegistry()
    reads = StreamReads(database.engine)

    async def read_missed(watched: Watched) -> Sequence[Change]:
        return await reads.missed(watched)

    backstop = Backstop(registry, read_missed, settings.poll_period_seconds)
    clock = StreamClock(registry, settings.streams.keep_alive_seconds)
    standings = Standings(registry, fetch, settings.streams.standing_period_seconds)
    components: list[Component] = [StreamDrain(registry), clock, backstop, standings]
    redis: RedisFanout | None = None
    publisher: Publisher
    if settings.redis_url:
        redis = RedisFanout(registry, settings.redis_url)
        publisher = redis
        components.append(redis)
    else:
        publisher = LocalFanout(registry)
    return Streams(
        registry=registry,
        publisher=publisher,
        components=components,
        redis=redis,
        backstop=backstop,
        standings=standings,
    )


def push_planner(settings: NotifySettings) -> PushPlanner:
    return PushPlanner(
        Rules(
            update_interval=timedelta(seconds=settings.pushes.update_interval_seconds),
            dismiss_after=timedelta(seconds=settings.pushes.dismiss_after_seconds),
        )
    )


def build(settings: NotifySettings, publisher: Publisher | None = None) -> ServiceApp:
    """``publisher``, when given, is what Deliver announces to instead of the streams'
    fan-out (tests that record what moved)."""
    return assemble(settings, publisher)[0]


def assemble(
    settings: NotifySettings, publisher: Publisher | None = None
) -> tuple[ServiceApp, Streams]:
    """The app and its streams' parts (tests publish through ``Streams.publisher``)."""
    database = Database(
        settings.common.database_url, "atelier-notify", limits=settings.common.database
    )
    tls = client_credentials(settings.common.internal_tls)
    creation = CreationStandings(
        settings.creation_internal_address, settings.common.service_credential, tls
    )
    streams = build_streams(settings, database, creation)
    engine = database.engine
    reads = StreamReads(engine)

    async def latest_of_jobs(job_ids: list[str]) -> dict[str, Change]:
        return await reads.latest_of_jobs(job_ids)

    async def user_snapshot(user_id: str, after_seq: int | None, limit: int) -> Snapshot:
        return await reads.user_snapshot(user_id, after_seq, limit)

    signer = MediaSigner(settings.media_internal_address, settings.common.service_credential, tls)
    cleanup = [signer.close, creation.close, database.close]
    if streams.redis is not None:
        cleanup.insert(0, streams.redis.close)
    output_urls = OutputUrls(signer)
    planner = push_planner(settings)
    delivery = Delivery(ProjectionStore(engine), publisher or streams.publisher, planner)
    components = list(streams.components)
    if settings.apns.enabled:
        sender, close_sender = build_sender(settings.apns, engine)
        components.append(sender)
        cleanup.insert(0, close_sender)
    app = ServiceApp(
        name="notify",
        public=[
            Binding(
                notify_service_pb2.DESCRIPTOR.services_by_name["NotifyService"],
                notify_service_pb2_grpc.add_NotifyServiceServicer_to_server,
                NotifyServicer(
                    Devices(TokenStore(engine), planner),
                    streams.registry,
                    settings.streams,
                    FirstStates(latest_of_jobs).get,
                    user_snapshot,
                    output_urls,
                    streams.standings,
                ),
            )
        ],
        internal=[
            Binding(
                notify_ingest_service_pb2.DESCRIPTOR.services_by_name["NotifyIngestService"],
                notify_ingest_service_pb2_grpc.add_NotifyIngestServiceServicer_to_server,
                NotifyIngestServicer(delivery),
            ),
            Binding(
                notify_feed_service_pb2.DESCRIPTOR.services_by_name["NotifyFeedService"],
                notify_feed_service_pb2_grpc.add_NotifyFeedServiceServicer_to_server,
                FeedServicer(
                    streams.registry,
                    settings.streams,
                    settings.poll_period_seconds,
                    FeedReads(engine),
                    output_urls,
                ),
            ),
            Binding(
                notify_admin_service_pb2.DESCRIPTOR.services_by_name["NotifyAdminService"],
                notify_admin_service_pb2_grpc.add_NotifyAdminServiceServicer_to_server,
                NotifyAdminServicer(FailedPushReads(engine)),
            ),
        ],
        readiness=database.answers,
        components=components,
        cleanup=cleanup,
    )
    return app, streams


# The collector's thresholds for the notify process. A broadcast leaves new objects alive
# in every stream it reaches (the stream's next wait, gRPC's write state), so at the
# default young threshold (700) one broadcast to 10,000 streams ran the collector again
# and again, its older generations with it, for almost no garbage: 10-20% of notify's CPU
# per stream message (docs/benchmarks.md, "notify: a broadcast to 10,000 streams").
# The counts are of objects allocated and still alive, so a higher threshold costs little
# memory: garbage freed by reference counting never counts.
GC_THRESHOLDS = (50_000, 20, 20)


def tune_collector() -> None:
    """Applies GC_THRESHOLDS, and moves what startup allocated (modules, descriptors) out
    of the collector's sight: a full collection then walks the streams' objects only."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main() -> int:
    tune_collector()
    settings = NotifySettings.from_env()
    return run_service(build(settings), settings.common, settings.listen)
