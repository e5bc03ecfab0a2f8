"""Webhook delivery against a real HTTP receiver that verifies every delivery with the
reference ``standardwebhooks`` package: bodies as GetJob prints the job, signatures
(both during a rotation), retries until the receiver is back (nothing lost; duplicates
only as retries, with the same webhook-id), isolation of a slow endpoint, 410 and other
4xx, the SSRF guard, the disabling of a failing endpoint, and what order a receiver
can rely on. Every test runs the deliverer with a short retry schedule (webhook_kit.FAST:
fractions of a second to a second; the default spans more than a day) so it stays fast."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.webhooks.deliverer import DISABLED
from services.creation.webhooks.signing import new_secret
from tests.integration.creation.webhook_kit import (
    PROGRESS,
    START,
    change,
    delivering,
    endpoint,
    endpoint_row,
    eventually,
    reset,
    rows,
    submit,
)
from tests.support.certificates import TestAuthority
from tests.support.webhook_receiver import Answer, WebhookReceiver


@pytest.fixture
async def clean(engine: AsyncEngine) -> AsyncEngine:
    await reset(engine)
    return engine


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    made = WebhookReceiver([])
    yield made
    made.stop()


async def test_each_delivery_verifies_and_carries_the_job_as_get_job_prints_it(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    endpoint_id, secret = await endpoint(clean, receiver.url)
    receiver.secrets.append(secret)
    async with delivering(clean, creation_url):
        (job_id,) = await submit(clean)
        # Delivered before the job moves on: its data is the queued job (an event fanned
        # out later carries the job as it is then, the next test).
        await receiver.wait_until(lambda r: len(r.accepted()) == 1, 30)
        await change(clean, START, job_id)
        await receiver.wait_until(lambda r: len(r.accepted()) == 2, 30)
        delivered = await eventually(clean, "state = 'succeeded'", 2, 30)
    assert receiver.unverified == []
    by_type = {r.body["type"]: r for r in receiver.accepted()}
    queued = by_type["job.queued"].body
    assert set(queued) == {"type", "timestamp", "data"}
    data = queued["data"]
    # camelCase, enums by name, int64 as a string, fields without presence printed.
    assert data["jobId"] == job_id and data["status"] == "JOB_STATUS_QUEUED"
    assert data["version"] == "1" and data["progressPercent"] == 0
    assert data["cancelRequested"] is False and data["outputs"] == []
    assert queued["timestamp"].endswith("Z")
    assert by_type["job.running"].body["data"]["status"] == "JOB_STATUS_RUNNING"
    assert {d["last_status_code"] for d in delivered} == {204}
    assert {d["message_id"] for d in delivered} == {r.webhook_id for r in receiver.accepted()}
    assert (await endpoint_row(clean, endpoint_id))["failing_since"] is None


async def test_an_event_fanned_out_after_its_job_moved_on_carries_the_job_as_it_is_then(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    """What docs/webhooks.md says: every change is an event of its own type, and its data
    is the job when the event was fanned out, at the change's version or a later one."""
    _, secret = await endpoint(clean, receiver.url, ["job.queued", "job.running", "job.progress"])
    receiver.secrets.append(secret)
    # Written while no deliverer runs: fanned out together, after the last change.
    (job_id,) = await submit(clean)
    await change(clean, START, job_id)
    await change(clean, PROGRESS, job_id)
    async with delivering(clean, creation_url):
        await receiver.wait_until(lambda r: len(r.accepted()) == 3, 30)
        delivered = await eventually(clean, "state = 'succeeded'", 3, 30)
    assert receiver.unverified == []
    assert sorted(d["job_version"] for d in delivered) == [1, 2, 3]
    bodies = {r.body["type"]: r.body for r in receiver.accepted()}
    assert set(bodies) == {"job.queued", "job.running", "job.progress"}
    # Each the job at version 3, running, with its progress.
    for sent in bodies.values():
        assert sent["data"]["jobId"] == job_id and sent["data"]["version"] == "3"
        assert sent["data"]["status"] == "JOB_STATUS_RUNNING"
    assert bodies["job.progress"]["data"]["progressPercent"] > 0


async def test_a_receiver_down_for_several_retries_then_up_gets_every_event(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    _, secret = await endpoint(clean, receiver.url, ["job.queued"])
    receiver.secrets.append(secret)
    receiver.stop()  # down: connections refused
    async with delivering(clean, creation_url):
        jobs = await submit(clean, 20)
        # Every delivery has been tried and failed at least three times.
        await eventually(clean, "attempts >= 3 AND state = 'pending'", 20, 60)
        receiver.start()  # the same port again
        await receiver.wait_until(lambda r: len({a.webhook_id for a in r.accepted()}) == 20, 60)
        delivered = await eventually(clean, "state = 'succeeded'", 20, 30)
    assert receiver.unverified == []
    assert {r.job_id for r in receiver.accepted()} == set(jobs)
    assert {d["message_id"] for d in delivered} == {r.webhook_id for r in receiver.accepted()}
    # A duplicate is only ever a retry: the same webhook-id with the same body.
    bodies: dict[str, dict[str, object]] = {}
    for received in receiver.received:
        assert bodies.setdefault(received.webhook_id, received.body) == received.body
    assert all(d["attempts"] >= 4 for d in delivered)


async def test_a_slow_endpoint_does_not_delay_another(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    slow = WebhookReceiver([])
    try:
        slow.answer = lambda _id: Answer(delay=4.0)  # past the 1 s timeout below
        slow_id, slow_secret = await endpoint(clean, slow.url, ["job.queued"], max_in_flight=1)
        _, secret = await endpoint(clean, receiver.url, ["job.queued"])
        slow.secrets.append(slow_secret)
        receiver.secrets.append(secret)
        async with delivering(clean, creation_url, timeout_seconds=1.0, claim_seconds=10.0):
            await submit(clean, 10)
            await receiver.wait_until(lambda r: len(r.accepted()) == 10, 30)
            # One at a time, each waiting out its timeout: the slow one has barely begun.
            waiting = await rows(clean, "endpoint_id = $1 AND attempts = 0", slow_id)
            assert len(waiting) >= 5
    finally:
        slow.stop()


async def test_410_disables_the_endpoint_and_other_4xx_fail_without_retry(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    gone = WebhookReceiver([])
    try:
        gone.answer = lambda _id: Answer(status=410)
        gone_id, gone_secret = await endpoint(clean, gone.url, ["job.queued"])
        refused_id, secret = await endpoint(clean, receiver.url, ["job.queued"])
        gone.secrets.append(gone_secret)
        receiver.secrets.append(secret)
        receiver.answer = lambda _id: Answer(status=422, body=b"x" * 1000)
        before = DISABLED.labels("gone")._value.get()
        async with delivering(clean, creation_url):
            await submit(clean)
            (failed,) = await eventually(
                clean, "endpoint_id = $1 AND state = 'failed'", 1, 30, refused_id
            )
            await eventually(clean, "endpoint_id = $1 AND state = 'failed'", 1, 30, gone_id)
        assert failed["attempts"] == 1 and failed["last_status_code"] == 422
        assert failed["last_response_excerpt"] == "x" * 256
        assert len(receiver.received) == 1
        row = await endpoint_row(clean, gone_id)
        assert (row["enabled"], row["disabled_reason"]) == (False, "gone")
        assert DISABLED.labels("gone")._value.get() == before + 1
        assert (await endpoint_row(clean, refused_id))["enabled"]
        # A disabled endpoint gets no more deliveries.
        await submit(clean)
        assert len(await rows(clean, "endpoint_id = $1", gone_id)) == 1
    finally:
        gone.stop()


async def test_429_is_retried_after_what_retry_after_asks(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    _, secret = await endpoint(clean, receiver.url, ["job.queued"])
    receiver.secrets.append(secret)
    answers = iter([Answer(status=429, headers={"retry-after": "2"})])
    receiver.answer = lambda _id: next(answers, Answer())
    async with delivering(clean, creation_url):
        await submit(clean)
        await receiver.wait_until(lambda r: len(r.accepted()) == 1, 30)
    first, second = receiver.received
    assert first.webhook_id == second.webhook_id
    # The schedule alone would have waited 0.3 s ± 20%.
    assert second.at - first.at >= 1.9


async def test_during_a_rotation_a_receiver_with_either_secret_verifies(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    old, new = new_secret(), new_secret()
    endpoint_id, _ = await endpoint(clean, receiver.url, secret=new, previous_secret=old)
    receiver.secrets.extend([old, new])
    async with delivering(clean, creation_url):
        (job_id,) = await submit(clean)
        await receiver.wait_until(lambda r: len(r.accepted()) == 1, 30)
        # The overlap ends: only the new secret signs.
        async with clean.begin() as connection:
            await connection.execute(
                text(
                    "UPDATE creation.webhook_endpoints"
                    " SET previous_secret_expires_at = now() - interval '1 second'"
                    " WHERE endpoint_id = :e"
                ),
                {"e": endpoint_id},
            )
        await change(clean, START, job_id)
        await receiver.wait_until(lambda r: len(r.accepted()) == 2, 30)
    during, after = receiver.accepted()
    assert during.verified_by == (0, 1)  # the old secret verifies, and the new one
    assert len(during.signature.split(" ")) == 2
    assert after.verified_by == (1,)
    assert receiver.unverified == []


async def test_the_guard_refuses_loopback_and_plain_http_and_follows_no_redirect(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    target = WebhookReceiver([])
    try:
        _, secret = await endpoint(clean, receiver.url, ["job.queued"])
        receiver.secrets.append(secret)
        # Loopback is refused where no test setting allows it.
        async with delivering(clean, creation_url, allowed_networks=()):
            (job_id,) = await submit(clean)
            (refused,) = await eventually(clean, "state = 'failed'", 1, 30)
        assert refused["last_error"].startswith("ADDRESS_NOT_ALLOWED")
        assert receiver.received == [] and receiver.unverified == []
        await reset(clean)
        # Plain http is refused where no test setting allows it.
        await endpoint(clean, receiver.url, ["job.queued"], secret=secret)
        async with delivering(clean, creation_url, allow_http=False):
            await submit(clean)
            (refused,) = await eventually(clean, "state = 'failed'", 1, 30)
        assert refused["last_error"].startswith("URL_NOT_HTTPS")
        assert receiver.received == []
        await reset(clean)
        # A redirect is an answer (retried later), never followed.
        endpoint_id, _ = await endpoint(clean, receiver.url, ["job.queued"], secret=secret)
        receiver.answer = lambda _id: Answer(status=307, headers={"location": target.url})
        async with delivering(clean, creation_url):
            await submit(clean)
            await eventually(clean, "attempts >= 2 AND last_status_code = 307", 1, 30)
        assert target.received == [] and target.unverified == []
        assert job_id
        assert (await endpoint_row(clean, endpoint_id))["enabled"]
    finally:
        target.stop()


async def test_an_endpoint_failing_for_the_disable_period_is_disabled(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    endpoint_id, secret = await endpoint(clean, receiver.url, ["job.queued"])
    receiver.secrets.append(secret)
    receiver.answer = lambda _id: Answer(status=503)
    before = DISABLED.labels("failing")._value.get()
    async with delivering(clean, creation_url, disable_after_seconds=1.5):
        await submit(clean)
        loop = asyncio.get_running_loop()
        until = loop.time() + 30
        while (await endpoint_row(clean, endpoint_id))["enabled"]:
            assert loop.time() < until, "the failing endpoint was never disabled"
            await asyncio.sleep(0.05)
    row = await endpoint_row(clean, endpoint_id)
    assert row["disabled_reason"] == "failing"
    assert row["updated_at"] - row["failing_since"] >= timedelta(seconds=1.5)
    assert DISABLED.labels("failing")._value.get() == before + 1
    # Its delivery stays pending (an operator may enable the endpoint again).
    (pending,) = await rows(clean)
    assert pending["state"] == "pending" and pending["attempts"] >= 2


async def test_a_retried_older_version_may_arrive_after_a_newer_one(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    """What docs/webhooks.md says: order per job is not guaranteed; each delivery
    carries the job's version, and a receiver keeps the highest it has seen."""
    _, secret = await endpoint(clean, receiver.url, ["job.queued", "job.progress", "job.running"])
    receiver.secrets.append(secret)
    refused_once: set[str] = set()

    def answer(webhook_id: str) -> Answer:
        if not refused_once:
            refused_once.add(webhook_id)
            return Answer(status=503)
        return Answer()

    receiver.answer = answer
    # The refused one is tried again 5 s later: long after the two newer versions, even on
    # a loaded machine.
    async with delivering(clean, creation_url, retry_schedule=(5.0,) * 5, jitter=0.0):
        (job_id,) = await submit(clean)
        await receiver.wait_until(lambda r: len(r.received) == 1, 30)
        await change(clean, START, job_id)
        # Each change fanned out before the next (a later fan-out would carry the newer
        # job: the test above).
        await receiver.wait_until(lambda r: len(r.accepted()) == 1, 30)
        await change(clean, PROGRESS, job_id)
        await receiver.wait_until(lambda r: len(r.accepted()) == 3, 30)
    versions = [r.version for r in receiver.accepted()]
    # Version 1, refused once, came last, with the body it was refused with.
    assert versions == [2, 3, 1]
    assert max(versions) == 3


async def test_two_deliverers_deliver_each_event_once(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    _, secret = await endpoint(clean, receiver.url, ["job.queued"], max_in_flight=16)
    receiver.secrets.append(secret)
    async with (
        delivering(clean, creation_url) as one,
        delivering(clean, creation_url) as two,
    ):
        await submit(clean, 200)
        await receiver.wait_until(lambda r: len(r.accepted()) >= 200, 60)
        await eventually(clean, "state = 'succeeded'", 200, 30)
    ids = Counter(r.webhook_id for r in receiver.received)
    assert len(ids) == 200 and set(ids.values()) == {1}
    assert one.attempted + two.attempted == 200
    assert receiver.unverified == []


async def test_a_deliverer_killed_mid_batch_leaves_nothing_undelivered(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    """kill -9 of the delivering process while its attempts are in flight: its claims
    lapse (3 s here) and another deliverer sends what it had taken (at least once)."""
    _, secret = await endpoint(clean, receiver.url, ["job.queued"], max_in_flight=8)
    receiver.secrets.append(secret)
    receiver.answer = lambda _id: Answer(delay=0.3)
    settings = {
        "batch": 50,
        "poll_seconds": 0.2,
        "timeout_seconds": 2.0,
        "claim_seconds": 3.0,
        "retry_schedule": [0.3] * 10,
        "allow_http": True,
        "allowed_networks": ["127.0.0.1/32"],
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.webhook_process",
        creation_url,
        json.dumps(settings),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        assert (await asyncio.wait_for(process.stdout.readline(), 60)).strip() == b"ready"
        jobs = await submit(clean, 40)
        await receiver.wait_until(lambda r: len(r.received) >= 5, 60)
        process.kill()  # SIGKILL: no drain, no record of what was in flight
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    unfinished = await rows(clean, "state <> 'succeeded'")
    assert unfinished, "the process finished everything before the kill"
    async with delivering(clean, creation_url, claim_seconds=3.0):
        await receiver.wait_until(lambda r: len({a.webhook_id for a in r.accepted()}) == 40, 90)
        await eventually(clean, "state = 'succeeded'", 40, 30)
    assert {r.job_id for r in receiver.accepted()} == set(jobs)
    bodies: dict[str, dict[str, object]] = {}
    for received in receiver.received:
        assert bodies.setdefault(received.webhook_id, received.body) == received.body
    assert receiver.unverified == []


async def test_an_endpoint_never_has_more_than_its_max_in_flight_across_deliverers(
    clean: AsyncEngine, creation_url: str, receiver: WebhookReceiver
) -> None:
    """Two deliverers, one endpoint with max_in_flight 3 answering in 0.3 s: at most three
    requests are ever open at the receiver at once (each replica claims within the room
    left, under the endpoint's row lock), and more than one at a time."""
    _, secret = await endpoint(clean, receiver.url, ["job.queued"], max_in_flight=3)
    receiver.secrets.append(secret)
    receiver.answer = lambda _id: Answer(delay=0.3)
    async with delivering(clean, creation_url), delivering(clean, creation_url):
        await submit(clean, 24)
        await receiver.wait_until(lambda r: len(r.accepted()) == 24, 60)
    assert 1 < receiver.most_in_flight <= 3
    assert receiver.unverified == []


async def test_https_checks_the_certificate_against_the_endpoints_host(
    clean: AsyncEngine, creation_url: str, tmp_path: Path
) -> None:
    """Over https (as in production: plain http refused), the connection goes to the
    checked address with the URL's host name for SNI and the certificate check: a
    certificate for that name is trusted, one for another name fails the attempt."""
    authority = TestAuthority(tmp_path)
    good = WebhookReceiver([], tls=authority.issue("good", dns_names=("localhost",), ips=()))
    wrong = WebhookReceiver([], tls=authority.issue("wrong", dns_names=("other.test",), ips=()))
    try:
        good_id, secret = await endpoint(clean, good.url, ["job.queued"])
        wrong_id, _ = await endpoint(clean, wrong.url, ["job.queued"], secret=secret)
        good.secrets.append(secret)
        async with delivering(
            clean,
            creation_url,
            allow_http=False,
            allowed_networks=("127.0.0.1/32", "::1/128"),
            ca_file=str(authority.ca_path),
        ):
            await submit(clean)
            await good.wait_until(lambda r: len(r.accepted()) == 1, 30)
            # The receiver counts a delivery before it answers: the deliverer records the
            # answer after that.
            await eventually(clean, "endpoint_id = $1 AND state = 'succeeded'", 1, 30, good_id)
            await eventually(
                clean,
                "endpoint_id = $1 AND attempts >= 1 AND last_error LIKE 'TLS_FAILED%'",
                1,
                30,
                wrong_id,
            )
        assert wrong.received == [] and wrong.unverified == [] and good.unverified == []
    finally:
        good.stop()
        wrong.stop()
