"""Traces through the real edge: the whole stack as processes with OTLP export on, a
collector (tests/support/otlp.py) in the test. A W3C traceparent the client sends through
Envoy — native gRPC or JSON — is the parent of the service's span, and a job submitted so
is one trace across the processes: creation's submit and attempt, media's answers to both,
and notify's span for each of the job's states."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import grpc
import httpx
import pytest

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.rpc import bearer
from tests.support.stacks import job_in, stack_of_its_own

CATALOG = "atelier.creation.v1.CreationService/ListCatalog"


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def traced(
    collector: OtlpReceiver, postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    env = {
        "ATELIER_OTEL_EXPORTER": "otlp",
        "ATELIER_OTEL_ENDPOINT": collector.endpoint,
        "ATELIER_OTEL_EXPORT_DELAY": "0.05",
        "ATELIER_STUB_DURATION": "0.5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.1",
    }
    work = tmp_path_factory.mktemp("traced")
    with stack_of_its_own(postgres_admin_url, work, "all", env) as stack:
        yield stack


def caller() -> tuple[str, str, str]:
    """A fresh (trace id, span id, traceparent) as a client would send it."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def in_trace(collector: OtlpReceiver, trace_id: str) -> list[ReceivedSpan]:
    return collector.where(lambda s: s.trace_id == trace_id)


async def test_a_traceparent_sent_over_grpc_through_the_edge_parents_the_service_span(
    traced: Stack, collector: OtlpReceiver
) -> None:
    trace_id, span_id, traceparent = caller()
    user = User()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{traced.ports.envoy}") as channel:
        await creation_service_pb2_grpc.CreationServiceStub(channel).ListCatalog(
            creation_service_pb2.ListCatalogRequest(),
            metadata=(*bearer(user.token), ("traceparent", traceparent)),
        )
    await collector.wait_for(lambda: bool(in_trace(collector, trace_id)))
    (span,) = in_trace(collector, trace_id)
    assert (span.service, span.name, span.kind) == ("creation", CATALOG, "server")
    assert span.parent_span_id == span_id
    assert span.attributes["rpc.grpc.status_code"] == 0


async def test_a_traceparent_sent_with_json_through_the_edge_parents_the_service_span(
    traced: Stack, collector: OtlpReceiver, http: httpx.AsyncClient
) -> None:
    trace_id, span_id, traceparent = caller()
    user = User()
    answer = await http.get(
        f"http://127.0.0.1:{traced.ports.envoy}/v1/catalog",
        headers={**user.headers, "traceparent": traceparent},
    )
    assert answer.status_code == 200, answer.text
    await collector.wait_for(lambda: bool(in_trace(collector, trace_id)))
    (span,) = in_trace(collector, trace_id)
    assert (span.service, span.name, span.parent_span_id) == ("creation", CATALOG, span_id)


async def test_a_job_submitted_through_the_edge_is_one_trace_across_the_services(
    traced: Stack, collector: OtlpReceiver, http: httpx.AsyncClient
) -> None:
    trace_id, span_id, traceparent = caller()
    user = User()
    asset = await put_input(traced, user.user_id)
    edge = f"http://127.0.0.1:{traced.ports.envoy}"
    submitted = await http.post(
        f"{edge}/v1/jobs",
        headers={**user.headers, "traceparent": traceparent},
        json=job_body(asset),
    )
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job"]["jobId"]
    done = await job_in(http, edge, user.headers, job_id, {"JOB_STATUS_SUCCEEDED"}, within=30)
    final = int(done["version"])

    def ingested() -> set[int]:
        return {
            int(s.attributes["atelier.job_version"])
            for s in in_trace(collector, trace_id)
            if s.name == "job state ingest"
        }

    def served() -> set[tuple[str, str]]:
        spans = in_trace(collector, trace_id)
        return {(s.service, s.name.rpartition("/")[2]) for s in spans if s.kind == "server"}

    # Each service exports on its own schedule: wait for every one the job passed through,
    # not just notify's, before judging the tree.
    media_calls = {
        ("media", method)
        for method in (
            "GetAssetInfo",
            # The input's URL, the output's reservation and commit: the calls of a
            # claimed batch's attempts go as one call each, traced under the batch's
            # first attempt to ask (this job's, alone in its batch).
            "GetAssetUrls",
            "ReserveOutputUploads",
            "CompleteOutputUploads",
        )
    }
    await collector.wait_for(
        lambda: (
            # The relay coalesces a job's versions taken in one batch (creation 0030):
            # the last one always reaches notify, the others may be folded into it.
            final in ingested()
            and media_calls | {("creation", "SubmitJob")} <= served()
            and any(s.name == "job attempt" for s in in_trace(collector, trace_id))
        ),
        what="notify's span for the final state, media's for each call, creation's attempt",
    )
    assert ingested() <= set(range(1, final + 1))
    spans = in_trace(collector, trace_id)
    (submit,) = [s for s in spans if s.name.endswith("/SubmitJob")]
    assert (submit.service, submit.kind, submit.parent_span_id) == ("creation", "server", span_id)
    (attempt,) = [s for s in spans if s.name == "job attempt"]
    assert (attempt.service, attempt.parent_span_id) == ("creation", submit.span_id)
    assert attempt.attributes["atelier.attempt_outcome"] == "succeeded"
    for state in (s for s in spans if s.name == "job state ingest"):
        assert (state.service, state.kind, state.parent_span_id) == (
            "notify",
            "consumer",
            submit.span_id,
        )
        assert state.attributes["atelier.job_id"] == job_id
