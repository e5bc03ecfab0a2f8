"""Finding out what the provider did, then adopting it, over a real creation server,
PostgreSQL, media and the stub provider's state directory: InspectJob shows the request a
lost submit left at the stub; RESOLUTION_ADOPT puts the job back to polling it (no new
submit, one capture), recorded as the operator's with the reason, and refuses what the
provider says is not the job's; the reaper adopts on its own when recovery is on and the
lookup finds exactly one request, and leaves the job to a person otherwise."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import update

from atelier.creation.v1 import admin_service_pb2, admin_service_pb2_grpc, job_pb2, ledger_pb2
from services.creation.domain import Job, Status, Step
from services.creation.providers.base import GenerationRequest, Provider
from services.creation.providers.replicate import ReplicateProvider
from services.creation.providers.stub import StubProvider, read_ledger
from services.creation.settings import StubSettings
from services.creation.store import jobs as job_store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.creation.tables import jobs
from services.creation.worker.loop import Worker
from services.creation.worker.reaper import Reaper
from services.kit.clock import system_clock
from services.kit.identities import entry
from tests.integration.creation.helpers import SERVICE, CreationHarness, running_creation
from tests.integration.creation.worker_kit import Engine, running
from tests.support.fenced import fenced_write
from tests.support.rpc import bad_request, bearer, error_info
from tests.support.workers import read_events, read_points

CREATION = "creation-credential-" + "c" * 24
OPERATOR = "operator-alice-" + "a" * 24
TTL = timedelta(seconds=5)
admin_pb = admin_service_pb2


@dataclass(frozen=True)
class Rig:
    engine: Engine
    stub: StubProvider
    ledger: Path
    admin: admin_service_pb2_grpc.AdminServiceStub
    creation: CreationHarness

    def reaper(self, auto_adopt: frozenset[str] = frozenset()) -> Reaper:
        return Reaper(
            self.engine.db,
            {"stub": self.stub},
            60,
            clock=after_expiry,
            media=self.engine.media_client,
            auto_adopt=auto_adopt,
        )

    def worker(self) -> Worker:
        return Worker(
            self.engine.db, self.engine.media_client, {"stub": self.stub}, self.engine.settings()
        )


def after_expiry() -> datetime:
    return system_clock() + TTL * 2


@pytest.fixture
async def rig(rig: Engine, creation_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    ledger = tmp_path / "stub-ledger"
    stub = StubProvider(
        StubSettings(
            duration_seconds=0.2, state_dir=str(tmp_path / "stub"), ledger_path=str(ledger)
        )
    )
    identities = json.dumps(
        [entry("creation", "creation", (CREATION,)), entry("alice", "operator", (OPERATOR,))]
    )
    async with running_creation(
        creation_url,
        rig.media_address,
        role="api",
        providers={"stub": stub},
        SERVICE_CREDENTIAL=CREATION,
        SERVICE_IDENTITIES=identities,
    ) as creation:
        creation.clock.set(system_clock())
        async with creation.internal_channel() as channel:
            yield Rig(rig, stub, ledger, admin_service_pb2_grpc.AdminServiceStub(channel), creation)


async def lost_submit(
    rig: Rig, *, submits: int = 1, auto_adopt: frozenset[str] = frozenset()
) -> tuple[Job, str | None]:
    """A job whose worker died after the provider accepted its submit (when
    ``submits`` times: 0, it never got there) and before the request id was stored,
    reaped to NEEDS_ATTENTION by a reaper with ``auto_adopt``; and the (last) request id
    the stub holds for it."""
    job = await rig.engine.submit()
    now = system_clock()
    (claimed,) = await leases.claim(rig.engine.db, "dead-worker", 1, TTL, now)
    assert claimed.job_id == job.job_id
    await fenced_write(
        rig.engine.db, FencedWrite.MARK_SUBMITTING, job.job_id, claimed.lease_epoch, now
    )
    request_id = None
    for _ in range(submits):
        request_id = await rig.stub.submit(generation(claimed), f"{job.job_id}:1")
    await rig.reaper(auto_adopt).sweep()
    reaped = await rig.engine.job(job.job_id)
    assert (reaped.status, reaped.step, reaped.provider_request_id) == (
        Status.NEEDS_ATTENTION,
        Step.SUBMITTING,
        None,
    )
    return reaped, request_id


def generation(job: Job) -> GenerationRequest:
    return GenerationRequest(
        job_id=job.job_id,
        attempt=job.attempt,
        provider_model=job.provider_model,
        style_id=job.style_id,
        prompt=job.prompt,
        negative_prompt="",
        width=job.width,
        height=job.height,
        input_image=None,
    )


def as_alice() -> tuple[tuple[str, str], ...]:
    return bearer(OPERATOR)


async def adopt(
    rig: Rig, job_id: str, request_id: str, reason: str = "the stub has it"
) -> job_pb2.Job:
    answer = await rig.admin.ResolveJob(
        admin_pb.ResolveJobRequest(
            job_id=job_id,
            resolution=admin_pb.RESOLUTION_ADOPT,
            provider_request_id=request_id,
            reason=reason,
        ),
        metadata=as_alice(),
    )
    return answer.job


async def test_inspect_job_finds_the_request_the_lost_submit_left(rig: Rig) -> None:
    job, request_id = await lost_submit(rig)
    inspected = await rig.admin.InspectJob(
        admin_pb.InspectJobRequest(job_id=job.job_id), metadata=as_alice()
    )
    assert inspected.job.status == job_pb2.JOB_STATUS_NEEDS_ATTENTION
    assert inspected.lookup_supported and inspected.lookup_note == ""
    assert (inspected.internals.step, inspected.internals.provider_request_id) == (
        "submitting",
        "",
    )
    assert inspected.internals.error_code == "OUTCOME_UNKNOWN"
    (found,) = inspected.provider_requests
    assert (found.request_id, found.source, found.attempt) == (
        request_id,
        admin_pb.PROVIDER_REQUEST_SOURCE_FOUND,
        1,
    )
    assert found.state in (
        admin_pb.PROVIDER_REQUEST_STATE_RUNNING,
        admin_pb.PROVIDER_REQUEST_STATE_SUCCEEDED,
    )
    assert found.HasField("submit_time")
    assert [e.to_status for e in inspected.events][-1] == job_pb2.JOB_STATUS_NEEDS_ATTENTION
    assert inspected.events[-1].actor_kind == job_pb2.ACTOR_KIND_REAPER


async def test_adopting_the_found_request_completes_the_job_with_one_submit(rig: Rig) -> None:
    job, request_id = await lost_submit(rig)
    assert request_id is not None
    adopted = await adopt(rig, job.job_id, request_id, reason="the stub holds the request")
    assert adopted.status == job_pb2.JOB_STATUS_QUEUED
    stored = await rig.engine.job(job.job_id)
    assert (stored.provider_request_id, stored.step, stored.error_code) == (
        request_id,
        Step.GENERATING,
        None,
    )
    async with running(rig.worker()):
        done = await rig.engine.until_job(job.job_id, lambda j: j.status is Status.SUCCEEDED)
    assert len(done.outputs) == 1 and done.attempt == 1
    assert read_ledger(rig.ledger) == {job.job_id: [request_id]}  # one submit in all
    points = (await read_points(rig.engine.db, [job.job_id]))[job.job_id]
    assert [kind for kind, _ in points] == ["reserve", "capture"]
    events = (await read_events(rig.engine.db, [job.job_id]))[job.job_id]
    decision = next(e for e in events if e.from_status == "needs_attention")
    assert (decision.to_status, decision.actor_kind, decision.actor_id) == (
        "queued",
        "operator",
        "alice",
    )
    assert decision.reason == f"adopted provider request {request_id}: the stub holds the request"


async def test_adopt_refuses_what_the_provider_says_is_not_the_jobs(rig: Rig) -> None:
    job, _ = await lost_submit(rig)
    other, others_request = await lost_submit(rig)
    assert others_request is not None
    for request_id, reason in (
        ("0" * 32, "PROVIDER_REQUEST_NOT_FOUND"),
        (others_request, "PROVIDER_REQUEST_OF_ANOTHER_JOB"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await adopt(rig, job.job_id, request_id)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(refused.value).reason == reason
    assert (await rig.engine.job(job.job_id)).status is Status.NEEDS_ATTENTION
    assert (await rig.engine.job(other.job_id)).status is Status.NEEDS_ATTENTION


async def test_adopt_takes_a_request_id_and_only_adopt_does(rig: Rig) -> None:
    job, request_id = await lost_submit(rig)
    assert request_id is not None
    for resolution, given in (
        (admin_pb.RESOLUTION_ADOPT, ""),
        (admin_pb.RESOLUTION_RETRY, request_id),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.admin.ResolveJob(
                admin_pb.ResolveJobRequest(
                    job_id=job.job_id,
                    resolution=resolution,
                    provider_request_id=given,
                    reason="checking",
                ),
                metadata=as_alice(),
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).reason == "INVALID_ADMIN_REQUEST"
        violations = bad_request(refused.value)
        assert violations is not None
        assert [v.field for v in violations.field_violations] == ["provider_request_id"]


async def test_adopt_is_for_operators_and_for_jobs_that_wait(rig: Rig) -> None:
    job, request_id = await lost_submit(rig)
    assert request_id is not None
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rig.admin.InspectJob(
            admin_pb.InspectJobRequest(job_id=job.job_id), metadata=bearer(CREATION)
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    await adopt(rig, job.job_id, request_id)
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await adopt(rig, job.job_id, request_id)
    assert error_info(again.value).reason == "JOB_NOT_AWAITING_OPERATOR"


async def test_adopt_leaves_a_job_its_owner_asked_to_cancel_to_the_cancel(rig: Rig) -> None:
    job, request_id = await lost_submit(rig)
    assert request_id is not None
    await job_store.cancel(rig.engine.db, job.user_id, job.job_id, system_clock())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await adopt(rig, job.job_id, request_id)
    assert error_info(refused.value).reason == "JOB_CANCEL_REQUESTED"


async def test_the_reaper_adopts_the_one_request_it_finds_when_recovery_is_on(rig: Rig) -> None:
    job = await rig.engine.submit()
    now = system_clock()
    (claimed,) = await leases.claim(rig.engine.db, "dead-worker", 1, TTL, now)
    await fenced_write(
        rig.engine.db, FencedWrite.MARK_SUBMITTING, job.job_id, claimed.lease_epoch, now
    )
    request_id = await rig.stub.submit(generation(claimed), f"{job.job_id}:1")
    reaped = await rig.reaper(auto_adopt=frozenset({"stub"})).sweep()
    assert [(j.job_id, j.status) for j in reaped] == [(job.job_id, Status.QUEUED)]
    stored = await rig.engine.job(job.job_id)
    assert (stored.status, stored.provider_request_id) == (Status.QUEUED, request_id)
    events = (await read_events(rig.engine.db, [job.job_id]))[job.job_id]
    assert [(e.to_status, e.actor_kind) for e in events[-2:]] == [
        ("needs_attention", "reaper"),
        ("queued", "reaper"),
    ]
    assert events[-1].reason.startswith("automatic recovery: provider stub holds exactly one")
    async with running(rig.worker()):
        await rig.engine.until_job(job.job_id, lambda j: j.status is Status.SUCCEEDED)
    assert read_ledger(rig.ledger) == {job.job_id: [request_id]}


async def test_with_none_or_several_found_or_recovery_off_a_person_decides(rig: Rig) -> None:
    recovery = frozenset({"stub"})
    # Recovery on, but the submit never reached the stub: nothing to adopt (lost_submit
    # asserts the job stays NEEDS_ATTENTION).
    nothing, _ = await lost_submit(rig, submits=0, auto_adopt=recovery)
    inspected = await rig.admin.InspectJob(
        admin_pb.InspectJobRequest(job_id=nothing.job_id), metadata=as_alice()
    )
    assert inspected.lookup_supported and list(inspected.provider_requests) == []
    # Recovery on, two requests for the job: which to take is a person's call.
    several, _ = await lost_submit(rig, submits=2, auto_adopt=recovery)
    inspected = await rig.admin.InspectJob(
        admin_pb.InspectJobRequest(job_id=several.job_id), metadata=as_alice()
    )
    assert len(inspected.provider_requests) == 2
    # Recovery off: the stub's one request is left alone.
    await lost_submit(rig, submits=1, auto_adopt=frozenset())
    assert read_ledger(rig.ledger)[several.job_id] == [
        r.request_id for r in inspected.provider_requests
    ]


async def test_a_hosted_job_says_its_adapter_cannot_look_requests_up(
    rig: Rig, creation_url: str
) -> None:
    job = await rig.engine.submit()
    async with rig.engine.db.begin() as connection:
        await connection.execute(
            update(jobs).where(jobs.c.job_id == job.job_id).values(provider_code="replicate")
        )
    replicate = ReplicateProvider.from_settings(rig.engine.settings())
    providers: dict[str, Provider] = {"stub": rig.stub, "replicate": replicate}
    try:
        async with (
            running_creation(
                creation_url,
                rig.engine.media_address,
                role="api",
                providers=providers,
            ) as creation,
            creation.internal_channel() as channel,
        ):
            admin = admin_service_pb2_grpc.AdminServiceStub(channel)
            inspected = await admin.InspectJob(
                admin_pb.InspectJobRequest(job_id=job.job_id),
                metadata=SERVICE,
            )
    finally:
        await replicate.close()
    assert not inspected.lookup_supported
    assert "Replicate keeps no client reference" in inspected.lookup_note
    assert list(inspected.provider_requests) == []


async def test_the_consoles_reads_show_the_queue_a_users_jobs_and_points(rig: Rig) -> None:
    caller = await rig.admin.GetCaller(admin_pb.GetCallerRequest(), metadata=as_alice())
    assert (caller.identity, caller.role) == ("alice", "operator")
    waiting, _ = await lost_submit(rig)
    queued = await rig.engine.submit(user=waiting.user_id)
    running = await rig.engine.submit()
    (leased,) = await leases.claim(rig.engine.db, "busy-worker", 1, TTL, system_clock())
    assert leased.job_id == queued.job_id or leased.job_id == running.job_id
    view = await rig.admin.GetQueueOverview(admin_pb.GetQueueOverviewRequest(), metadata=as_alice())
    assert (view.queued, view.needs_attention, view.running) == (1, 1, 1)
    assert view.oldest_queued_age.ToTimedelta() >= timedelta(0)
    (shown,) = view.running_jobs
    assert (shown.job.job_id, shown.internals.lease_owner) == (leased.job_id, "busy-worker")
    assert shown.internals.lease_expire_time.ToDatetime(tzinfo=UTC) == leased.lease_expires_at

    by_user = await rig.admin.SearchJobs(
        admin_pb.SearchJobsRequest(user_id=waiting.user_id), metadata=as_alice()
    )
    assert {j.job_id for j in by_user.jobs} == {waiting.job_id, queued.job_id}
    by_id = await rig.admin.SearchJobs(
        admin_pb.SearchJobsRequest(job_id=waiting.job_id), metadata=as_alice()
    )
    assert [j.job_id for j in by_id.jobs] == [waiting.job_id]
    nobody = await rig.admin.SearchJobs(
        admin_pb.SearchJobsRequest(job_id=str(uuid.uuid4())), metadata=as_alice()
    )
    assert list(nobody.jobs) == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rig.admin.SearchJobs(admin_pb.SearchJobsRequest(), metadata=as_alice())
    assert error_info(refused.value).reason == "INVALID_ADMIN_REQUEST"

    points = await rig.admin.ListUserLedger(
        admin_pb.ListUserLedgerRequest(user_id=waiting.user_id, page_size=2), metadata=as_alice()
    )
    # 100 welcome points, two jobs of 5 reserved (the one waiting holds its points).
    assert (points.available_points, points.reserved_points) == (90, 10)
    assert len(points.ledger_entries) == 2 and points.next_page_token
    rest = await rig.admin.ListUserLedger(
        admin_pb.ListUserLedgerRequest(
            user_id=waiting.user_id, page_size=2, page_token=points.next_page_token
        ),
        metadata=as_alice(),
    )
    kinds = [e.kind for e in [*points.ledger_entries, *rest.ledger_entries]]
    assert kinds.count(ledger_pb2.LEDGER_ENTRY_KIND_GRANT) == 1
    stranger = await rig.admin.ListUserLedger(
        admin_pb.ListUserLedgerRequest(user_id="never-seen"), metadata=as_alice()
    )
    assert (stranger.available_points, list(stranger.ledger_entries)) == (0, [])
