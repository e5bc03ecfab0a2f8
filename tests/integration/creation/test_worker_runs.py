"""The worker runs jobs end to end on real PostgreSQL with a real media service: success
with the output stored in media and the points captured, progress coalesced by the lease
keeper, retries with backoff, failures by the table, an unknown submit outcome, a resumed
request, and a NOTIFY that wakes the worker long before its poll would."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from services.creation.domain import Status
from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    PollResult,
    ProviderError,
    Running,
)
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.creation.tables import outbox
from services.kit.clock import system_clock
from tests.integration.creation.helpers import payloads_kept, side_rows
from tests.integration.creation.worker_kit import (
    Engine,
    output_png,
    running,
    until,
)
from tests.support.fenced import fenced_write

TTL_SECONDS = 5


async def test_a_job_runs_to_succeeded_with_its_output_in_media(rig: Engine) -> None:
    job = await rig.submit()
    worker = rig.worker()
    async with running(worker):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.progress, done.attempt, done.step) == (
        Status.SUCCEEDED,
        100,
        1,
        "done",
    )
    assert rig.provider.submits == [(job.job_id, f"{job.job_id}:1")]
    # The adapter's version is recorded with the job (Provider.version).
    assert done.provider_version == rig.provider.version
    request = rig.provider.requests[0]
    assert (request.style_id, request.width, request.input_image.content_type) == (
        "watercolor",
        512,
        "image/png",
    )
    assert len(done.outputs) == 1
    stored = await rig.media.store.get(uuid.UUID(done.outputs[0]))
    assert stored is not None
    assert (stored.owner_user_id, stored.purpose.value, stored.status.value) == (
        job.user_id,
        "ai_output",
        "ready",
    )
    read = await rig.media_client.read_asset(done.outputs[0], 10_000_000)
    assert read.data == output_png().data
    rows = await side_rows(rig.db, job.job_id)
    assert rows["ledger"] == [("reserve", 5), ("capture", 5)]
    assert [e[1:] for e in rows["events"]] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "succeeded"),
    ]


async def test_progress_reaches_the_job_coalesced_at_most_once_per_beat(
    rig: Engine,
) -> None:
    async with payloads_kept(rig.db):  # each version's state, kept in its outbox row
        await _progress_written_by_beats(rig)


async def _progress_written_by_beats(rig: Engine) -> None:
    job = await rig.submit()
    worker = rig.worker()
    reported: list[int] = []
    finish = asyncio.Event()

    async def poll(request_id: str) -> PollResult:
        if len(reported) < 9:
            reported.append((len(reported) + 1) * 10)
            return Running(reported[-1])
        if finish.is_set():
            return Done([output_png()])
        return Running(90)

    rig.provider.on_poll = poll
    async with running(worker):
        await until(lambda: len(reported) == 9)
        beats = worker.keeper.beats
        await until(lambda: worker.keeper.beats >= beats + 2)
        finish.set()
        await rig.until_job(job.job_id, lambda j: j.status.terminal)
    async with rig.db.connect() as connection:
        payloads = (
            (
                await connection.execute(
                    select(outbox.c.payload)
                    .where(outbox.c.job_id == job.job_id)
                    .order_by(outbox.c.version)
                )
            )
            .scalars()
            .all()
        )
    progress = [p.get("progressPercent") for p in payloads if p["status"] == "JOB_STATUS_RUNNING"]
    written = [p for p in progress if p]
    # Nine reports, far fewer versions: only the newest value of each beat is written.
    assert 1 <= len(written) <= worker.keeper.beats
    assert len(written) < 9
    assert written[-1] == 90
    assert written == sorted(written)


async def test_a_retryable_failure_retries_with_backoff_then_succeeds(rig: Engine) -> None:
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        if request_id.endswith(":1"):
            return Failed("UNAVAILABLE", "the model is warming up", retryable=True)
        return Done([output_png()])

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt, done.error_code) == (Status.SUCCEEDED, 2, None)
    assert rig.provider.submits == [
        (job.job_id, f"{job.job_id}:1"),
        (job.job_id, f"{job.job_id}:2"),
    ]
    events = (await side_rows(rig.db, job.job_id))["events"]
    assert [e[1:] for e in events] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "queued"),
        ("queued", "running"),
        ("running", "succeeded"),
    ]


async def test_attempts_exhausted_fail_the_job_with_its_code(rig: Engine) -> None:
    job = await rig.submit(max_attempts=2)

    async def poll(request_id: str) -> PollResult:
        return Failed("TIMEOUT", "the model took too long", retryable=True)

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt, done.error_code, done.error_message) == (
        Status.FAILED,
        2,
        "TIMEOUT",
        "the model took too long",
    )
    assert len(rig.provider.submits) == 2
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [
        ("reserve", 5),
        ("release", 5),
    ]


async def test_a_final_failure_fails_at_once(rig: Engine) -> None:
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        # The provider calls it retryable; the table knows better.
        return Failed("CONTENT_REJECTED", "the image breaks the rules", retryable=True)

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt, done.error_code) == (Status.FAILED, 1, "CONTENT_REJECTED")
    assert len(rig.provider.submits) == 1


async def test_an_unknown_submit_outcome_needs_attention_with_one_submit(
    rig: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    job = await rig.submit()
    now = datetime.now(UTC)
    before = now.replace(microsecond=now.microsecond // 1000 * 1000)  # the line's precision

    async def submit(request: GenerationRequest, key: str) -> str:
        raise ProviderError("TIMEOUT", "no answer", retryable=True, outcome_unknown=True)

    rig.provider.on_submit = submit
    worker = rig.worker()
    async with running(worker):
        done = await rig.until_job(job.job_id, lambda j: j.status is Status.NEEDS_ATTENTION)
        await until(lambda: worker.context.outcomes.get(job.job_id) == "outcome_unknown")
    assert (done.error_code, done.provider_request_id, done.lease_owner) == (
        "OUTCOME_UNKNOWN",
        None,
        None,
    )
    assert rig.provider.submits == [(job.job_id, f"{job.job_id}:1")]
    # What an operator matches in the provider's request list is in the warning (the
    # line of every submit, submit_started, is DEBUG and not written here).
    [warning] = [r for r in caplog.records if r.getMessage() == "submit_outcome_unknown"]
    fields = warning.fields  # type: ignore[attr-defined]
    assert warning.levelno == logging.WARNING
    assert {k: fields[k] for k in ("job_id", "attempt", "provider", "code")} == {
        "job_id": job.job_id,
        "attempt": 1,
        "provider": "stub",
        "code": "TIMEOUT",
    }
    assert {"provider_version", "provider_model"} <= fields.keys()
    assert before <= datetime.fromisoformat(fields["submit_started_at"]) <= datetime.now(UTC)
    assert not [r for r in caplog.records if r.getMessage() == "submit_started"]
    # The points stay reserved until an operator decides.
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [("reserve", 5)]


async def test_a_job_with_a_request_resumes_polling_and_never_submits(rig: Engine) -> None:
    job = await rig.submit()
    # An earlier worker submitted, stored the request id, and handed the job back.
    now = system_clock()
    (held,) = await leases.claim(rig.db, "earlier", 1, _ttl(), now)
    await fenced_write(rig.db, FencedWrite.MARK_SUBMITTING, held.job_id, held.lease_epoch, now)
    await fenced_write(
        rig.db, FencedWrite.RECORD_REQUEST, held.job_id, held.lease_epoch, now, "req-earlier"
    )
    await leases.hand_back(rig.db, held.job_id, held.lease_epoch, _ttl() * 0, now)
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt, done.provider_request_id) == (
        Status.SUCCEEDED,
        1,
        "req-earlier",
    )
    assert rig.provider.submits == []
    assert rig.provider.polls == ["req-earlier"]


async def test_notify_wakes_the_worker_long_before_its_poll(rig: Engine) -> None:
    worker = rig.worker(WORKER_POLL="300")
    async with running(worker):
        # Idle: connected, and past the wake every (re)connect gives.
        await until(lambda: worker.listener.connected.is_set() and worker.claim_rounds >= 2)
        job = await rig.submit()
        # Only the NOTIFY can wake it now: the poll is five minutes away.
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal, seconds=10)
    assert done.status is Status.SUCCEEDED


def _ttl() -> timedelta:
    return timedelta(seconds=TTL_SECONDS)


async def test_an_adapter_that_raises_on_submit_is_an_unknown_outcome(rig: Engine) -> None:
    job = await rig.submit()

    async def submit(request: GenerationRequest, key: str) -> str:
        raise KeyError("a bug in the adapter, after it may have sent the request")

    rig.provider.on_submit = submit
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status is Status.NEEDS_ATTENTION)
    assert done.error_code == "OUTCOME_UNKNOWN"
    assert len(rig.provider.submits) == 1


async def test_poll_errors_hand_the_job_back_keeping_its_request(rig: Engine) -> None:
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        if len(rig.provider.polls) <= 5:
            raise ConnectionResetError("the adapter let a socket error through")
        return Done([output_png()])

    rig.provider.on_poll = poll
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    assert (done.status, done.attempt) == (Status.SUCCEEDED, 1)
    assert len(rig.provider.submits) == 1
    events = [e[1:] for e in (await side_rows(rig.db, job.job_id))["events"]]
    assert events == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "queued"),  # handed back after five failed polls, request kept
        ("queued", "running"),
        ("running", "succeeded"),
    ]


async def test_an_input_deleted_before_the_worker_reads_it_fails_the_job_and_releases_its_points(
    rig: Engine,
) -> None:
    job = await rig.submit()
    await rig.media_client.delete_asset(job.input_asset_id)
    async with running(rig.worker()):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
    # Not retried (reading again will not help), in words the owner can act on.
    assert (done.status, done.error_code, done.attempt) == (Status.FAILED, "INPUT_UNREADABLE", 1)
    assert (done.error_reason, done.error_retryable) == ("PROVIDER_REJECTED_INPUT", False)
    assert done.error_message == f"input asset {job.input_asset_id}: the asset was deleted"
    assert rig.provider.submits == []
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [("reserve", 5), ("release", 5)]
