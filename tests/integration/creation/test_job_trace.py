"""A job's life is one trace, seen from inside one process: creation (API, worker and
relay), media and notify each run here on real listeners over real PostgreSQL, so every
span lands in the same in-memory exporter. The client's traceparent is the SubmitJob
span's parent; the submit's media call, the worker's attempt (and its media calls) and
notify's span for each of the job's states the relay sent (its final one among them) all
belong to that trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.creation.app import build
from services.creation.media_client import MediaClient
from services.creation.tables import jobs
from services.kit.server import RunningService
from services.kit.settings import DEV_SERVICE_TOKEN, ListenSettings
from tests.integration.creation.helpers import new_user, user_token
from tests.integration.creation.worker_kit import FakeProvider, engine_settings
from tests.support.databases import migrated_database
from tests.support.media import image_bytes, media_settings, running_media
from tests.support.notify import running_notify
from tests.support.spans import Spans, parent_id, recorded_spans, span_id, trace_id

CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
CALLER = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"
SUBMIT = "atelier.creation.v1.CreationService/SubmitJob"
INGEST = "job state ingest"


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


def of_job(spans: Spans, name: str, job_id: str) -> list[ReadableSpan]:
    return [s for s in spans.named(name) if (s.attributes or {}).get("atelier.job_id") == job_id]


def kind(spans: Spans, name: str, wanted: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans.named(name) if s.kind is wanted]


async def test_a_job_is_one_trace_from_the_callers_submit_to_notify(
    engine: AsyncEngine, creation_url: str, media_url: str, notify_url: str, tmp_path: Path
) -> None:
    with recorded_spans() as spans:
        async with (
            running_media(media_settings(media_url, tmp_path)) as media,
            running_notify(notify_url) as notify,
        ):
            media_address = f"127.0.0.1:{media.running.internal_port}"
            settings = engine_settings(
                creation_url,
                media_address,
                DRAIN_GRACE="0",
                WELCOME_POINTS="100",
                NOTIFY_INTERNAL_ADDRESS=notify.internal_address,
            )
            app = build(settings, "all", providers={"stub": FakeProvider()})
            creation = RunningService(app, settings.common, ListenSettings(0, 0, 0))
            await creation.start()
            try:
                user = new_user()
                uploader = MediaClient(media_address, DEV_SERVICE_TOKEN)
                asset = await uploader.put_asset(user, "ai_input", "image/png", image_bytes("PNG"))
                await uploader.close()
                public = f"127.0.0.1:{creation.public_port}"
                async with grpc.aio.insecure_channel(public) as channel:
                    submitted = await creation_service_pb2_grpc.CreationServiceStub(
                        channel
                    ).SubmitJob(
                        creation_service_pb2.SubmitJobRequest(
                            model_id="stub-fast",
                            style_id="watercolor",
                            input_asset_id=asset,
                            prompt="a fox",
                            width=512,
                            height=512,
                        ),
                        metadata=(*user_token(user), ("traceparent", CALLER)),
                    )
                job_id = submitted.job.job_id
                await spans.wait_for(
                    lambda: bool(of_job(spans, "job attempt", job_id)), what="the attempt"
                )
                async with engine.connect() as connection:
                    row = (
                        await connection.execute(
                            select(jobs.c.version, jobs.c.status, jobs.c.trace_parent).where(
                                jobs.c.job_id == job_id
                            )
                        )
                    ).one()
                final = int(row.version)
                # The relay sends a job's newest state per round (superseded versions
                # in one round coalesce): the final version is always among them.
                await spans.wait_for(
                    lambda: (
                        final
                        in {
                            (s.attributes or {}).get("atelier.job_version")
                            for s in of_job(spans, INGEST, job_id)
                        }
                    ),
                    what="notify's span for the final version",
                )
            finally:
                await creation.stop()

    assert row.status == "succeeded"
    submit = spans.one(SUBMIT)
    # The caller's span is the submit's parent; the job keeps the submit's own context.
    assert (trace_id(submit), parent_id(submit)) == (CALLER_TRACE, CALLER_SPAN)
    assert row.trace_parent == f"00-{CALLER_TRACE:032x}-{span_id(submit):016x}-01"

    # creation -> media during the submit: CLIENT under the submit, media's SERVER under it.
    (asked,) = kind(spans, "atelier.media.v1.MediaInternalService/GetAssetInfo", SpanKind.CLIENT)
    (answered,) = kind(spans, "atelier.media.v1.MediaInternalService/GetAssetInfo", SpanKind.SERVER)
    assert parent_id(asked) == span_id(submit)
    assert parent_id(answered) == span_id(asked)
    assert trace_id(answered) == CALLER_TRACE

    # The worker's attempt: a child of the submit, its media calls under it.
    (attempt,) = of_job(spans, "job attempt", job_id)
    assert (trace_id(attempt), parent_id(attempt)) == (CALLER_TRACE, span_id(submit))
    assert (attempt.attributes or {})["atelier.attempt_outcome"] == "succeeded"
    # Its input read by a signed URL, its output reserved and committed: the bytes go by
    # HTTP, beside the trace. The input's URL comes from the batched lookup of a claimed
    # batch's attempts (GetAssetUrls), as are its outputs' reservations and commits
    # (ReserveOutputUploads, CompleteOutputUploads), each traced under the batch's first
    # attempt to ask: this one.
    for method in ("GetAssetUrls", "ReserveOutputUploads", "CompleteOutputUploads"):
        (call,) = [
            s
            for s in kind(spans, f"atelier.media.v1.MediaInternalService/{method}", SpanKind.CLIENT)
            if trace_id(s) == CALLER_TRACE
        ]
        assert parent_id(call) == span_id(attempt), method
        (served,) = [
            s
            for s in kind(spans, f"atelier.media.v1.MediaInternalService/{method}", SpanKind.SERVER)
            if parent_id(s) == span_id(call)
        ]
        assert trace_id(served) == CALLER_TRACE

    # notify: a span per state, each a child of the submit, linked to the Deliver that
    # carried it; that Deliver hangs under the relay's own span, which links to the job.
    ingested = of_job(spans, INGEST, job_id)
    delivers = {
        span_id(s): s
        for s in kind(spans, "atelier.notify.v1.NotifyIngestService/Deliver", SpanKind.SERVER)
    }
    relay_spans = {span_id(s): s for s in spans.named("outbox deliver")}
    for state in ingested:
        assert (trace_id(state), parent_id(state)) == (CALLER_TRACE, span_id(submit))
        assert state.kind is SpanKind.CONSUMER
        (link,) = state.links
        deliver = delivers[link.context.span_id]
        sent = next(
            s
            for s in kind(spans, "atelier.notify.v1.NotifyIngestService/Deliver", SpanKind.CLIENT)
            if span_id(s) == parent_id(deliver)
        )
        relay = relay_spans[parent_id(sent)]  # type: ignore[index]
        assert relay.kind is SpanKind.PRODUCER
        assert trace_id(relay) != CALLER_TRACE  # a batch is a trace of its own ...
        linked = {(link.context.trace_id, link.context.span_id) for link in relay.links}
        assert (CALLER_TRACE, span_id(submit)) in linked  # ... linked to the job's
    assert any((s.attributes or {}).get("atelier.applied") for s in ingested)
