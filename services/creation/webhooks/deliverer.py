"""The webhook deliverer, a component every creation process runs (any number of
replicas share the work).

It claims due deliveries (store/webhook_deliveries.py, creation.claim_webhooks: ``FOR
UPDATE SKIP LOCKED``, endpoint by endpoint, each up to its ``max_in_flight`` less what is
already in flight anywhere, half of an endpoint's slots a claim), builds each body
(body.py: one call to media signs the outputs of a whole claim), signs it (signing.py)
and POSTs it behind the SSRF guard (kit/outbound.py), each attempt its own task: a slow
endpoint holds only its own slots. Outcomes are recorded as they come (those that arrive
while a statement runs go in the next), fenced by the claim; a deliverer that dies leaves
its claims to lapse, and the next one sends those deliveries again (at least once: the
same webhook-id). A round woken by a NOTIFY on ``creation_webhooks`` (sent at the commit
of a marked job change and of new deliveries), by the poll (the fallback) or by a
reconnect first fans the job changes marked since out to their deliveries
(``creation.fan_out_webhooks``: the job's own statements write no delivery); a recorded
batch wakes it too (its endpoints have room again), and a claim that left an endpoint
room past its half is followed by another at once: while one half's answers are recorded
and its slots claimed again, the other half is on the wire.

Secrets are never logged; of an answer, only its status and an excerpt of at most 256
characters are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from services.creation.media_client import OutputUrls
from services.creation.store import webhook_deliveries as store
from services.creation.store.webhook_deliveries import WEBHOOKS_CHANNEL, Attempted, Claimed
from services.creation.webhooks import signing
from services.creation.webhooks.body import body, job_of
from services.creation.webhooks.schedule import retry_after, verdict
from services.creation.webhooks.settings import WebhookSettings
from services.kit.addresses import AddressPolicy
from services.kit.db import driver_connection
from services.kit.listen import Listener
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify
from services.kit.outbound import (
    Answer,
    OutboundClient,
    OutboundFailed,
    OutboundPolicy,
    OutboundRefused,
)

log = get_logger(__name__)

EXCERPT = 256
PRUNE_PERIOD = 300.0
PRUNE_BATCH = 1000
# Outbox rows fanned out to deliveries per statement, and statements per claim round.
FAN_OUT_BATCH = 500
FAN_OUT_BATCHES = 8
# A claim takes at most this share of an endpoint's slots (ceil(max_in_flight / parts)): its
# next part is claimed and sent while the last one's answers are being recorded, so the
# slots stay busy instead of all waiting for one cycle of record and claim.
CLAIM_PARTS = 2

# The outcomes of an attempt, and why the deliverer disables an endpoint (metric labels).
OUTCOMES = ("succeeded", "retried", "failed")
DISABLED_REASONS = ("gone", "failing")
ATTEMPTS = Counter(
    "atelier_webhook_attempts",
    "Webhook delivery attempts, by what came of them (succeeded, retried, failed)",
    ["outcome"],
)
DISABLED = Counter(
    "atelier_webhook_endpoints_disabled",
    "Webhook endpoints the deliverer disabled: gone (410) or failing (every attempt failed"
    " for ATELIER_WEBHOOK_DISABLE_AFTER)",
    ["reason"],
)


class Media(Protocol):
    async def output_urls(self, asset_ids: Sequence[str]) -> dict[str, OutputUrls]: ...


def outbound_client(settings: WebhookSettings) -> OutboundClient:
    tls = ssl.create_default_context()
    if settings.ca_file:
        tls.load_verify_locations(cafile=settings.ca_file)
    policy = OutboundPolicy(
        addresses=AddressPolicy.allowing(settings.allowed_networks),
        allow_http=settings.allow_http,
        timeout_seconds=settings.timeout_seconds,
        max_body_bytes=4096,
        resolve_seconds=settings.resolve_seconds,
        user_agent="atelier-webhooks/1",
    )
    return OutboundClient(policy, tls)


class WebhookDeliverer:
    name = "webhook-deliverer"

    def __init__(
        self,
        engine: AsyncEngine,
        media: Media,
        settings: WebhookSettings,
        database_url: str,
        *,
        client: OutboundClient | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
        self._media = media
        self._settings = settings
        self._client = client or outbound_client(settings)
        self._rng = rng or random.Random()  # noqa: S311 (spreads retries; nothing secret)
        self.listener = Listener(database_url, WEBHOOKS_CHANNEL, on_notify=self._heard)
        # A round fans out when a job change may have been marked since the last fan-out
        # (a notification, a reconnect or the poll), or when that one left rows marked; a
        # round started only because recorded outcomes freed slots does not, so a stream
        # of deliveries pays no fan-out statement per claim. At least once a poll period.
        self._fan_out_wanted = True
        self._next_fan_out = 0.0
        self._stopping = asyncio.Event()
        self._room = asyncio.Event()
        self._results: list[Attempted] = []
        self._results_ready = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._log = Throttle()
        self._next_prune = 0.0
        self._failures = 0
        # For tests and the bench: attempts made and recorded by this deliverer.
        self.attempted = 0
        self.recorded = 0

    async def run(self) -> None:
        listening = asyncio.create_task(self.listener.run(), name=self.listener.name)
        flushing = asyncio.create_task(self._flush_loop(), name="webhook-records")
        log.info("webhooks_started", concurrency=self._settings.concurrency)
        try:
            while not self._stopping.is_set():
                if listening.done():
                    listening.result()
                    raise RuntimeError("the webhooks listener ended on its own")
                if flushing.done():
                    flushing.result()
                    raise RuntimeError("the webhook recorder ended on its own")
                full = await self._claim_round()
                if full is None:
                    await self._pause(self._retry_delay())
                    continue
                await self._prune_if_due()
                if not full:
                    await self._wait()
        finally:
            await self._drain()
            flushing.cancel()
            await asyncio.gather(flushing, return_exceptions=True)
            await self._flush()
            await self.listener.stop(0)
            await asyncio.gather(listening, return_exceptions=True)
            await self._client.close()
            log.info("webhooks_stopped", attempted=self.attempted)

    def _heard(self, payload: str) -> None:
        self._fan_out_wanted = True

    async def stop(self, deadline: float) -> None:
        self._deadline = deadline
        self._stopping.set()

    # --- claiming -----------------------------------------------------------------------

    async def _claim_round(self) -> bool | None:
        """Claims what there is room for and starts its attempts: True when there is more
        to claim at once (the claim came back full, or an endpoint had room past the part
        it gave this claim), False when not, None after a failure."""
        free = self._settings.concurrency - len(self._in_flight)
        if free <= 0:
            return False
        limit = min(self._settings.batch, free)
        try:
            async with driver_connection(self._engine) as connection:
                # Job changes since the last round become deliveries first (a bounded number
                # of batches a round: a large backlog does not keep the claim waiting).
                if self._fan_out_wanted or time.monotonic() >= self._next_fan_out:
                    self._fan_out_wanted = False
                    self._next_fan_out = time.monotonic() + self._settings.poll_seconds
                    for _ in range(FAN_OUT_BATCHES):
                        if await store.fan_out(connection, FAN_OUT_BATCH) < FAN_OUT_BATCH:
                            break
                    else:
                        self._fan_out_wanted = True  # more is marked than a round takes
                claimed = await store.claim(
                    connection, limit, self._settings.claim_seconds, CLAIM_PARTS
                )
        except Exception as error:
            self._fan_out_wanted = True  # the failed round's fan-out may not have run
            outage = classify(error)
            if outage is None:
                raise
            self._failed(outage.dependency, outage.kind)
            return None
        if self._failures:
            log.info("webhooks_claiming_again", failed_rounds=self._failures)
            self._failures = 0
        if claimed:
            await self._start(claimed)
        return len(claimed) == limit or any(row.more for row in claimed)

    async def _start(self, claimed: list[Claimed]) -> None:
        jobs: list[job_pb2.Job | None] = []
        for row in claimed:
            try:
                jobs.append(job_of(json.loads(row.payload)))
            except Exception:  # a payload that is no Job: recorded as failed, not retried
                jobs.append(None)
        assets = [
            output.asset_id
            for job in jobs
            if job is not None and job.status == job_pb2.JOB_STATUS_SUCCEEDED
            for output in job.outputs
        ]
        urls: Mapping[str, OutputUrls] = await self._media.output_urls(assets) if assets else {}
        for row, job in zip(claimed, jobs, strict=True):
            task = asyncio.create_task(self._guarded(row, job, urls))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _wait(self) -> None:
        if self._room.is_set():
            self._room.clear()
            return
        waits = [
            asyncio.ensure_future(self.listener.woken(self._settings.poll_seconds)),
            asyncio.ensure_future(self._room.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if waits[0].done() and not waits[0].cancelled():
            self._fan_out_wanted = True  # woken by the listener or the poll
        self._room.clear()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _retry_delay(self) -> float:
        ceiling = min(5.0, 0.1 * 2 ** min(self._failures, 10))
        return self._rng.uniform(0, ceiling)

    def _failed(self, dependency: str, kind: str) -> None:
        self._failures += 1
        skipped = self._log.admit(f"{dependency}:{kind}")
        if skipped is not None:
            log.warning("webhooks_claim_failed", dependency=dependency, kind=kind, skipped=skipped)

    # --- one attempt --------------------------------------------------------------------

    async def _guarded(
        self, row: Claimed, job: job_pb2.Job | None, urls: Mapping[str, OutputUrls]
    ) -> None:
        try:
            await self._attempt(row, job, urls)
        except Exception:
            # A bug, not the endpoint's doing: logged with its trace; the delivery is
            # tried again by the schedule.
            log.exception("webhook_attempt_crashed", endpoint_id=row.endpoint_id)
            now = datetime.now(UTC)
            outcome = verdict(self._settings, row.attempts, None, None, now, self._rng)
            self._record(
                row, outcome.state, outcome.next_attempt_at, now, None, "INTERNAL", "", False, False
            )

    async def _attempt(
        self, row: Claimed, job: job_pb2.Job | None, urls: Mapping[str, OutputUrls]
    ) -> None:
        self.attempted += 1
        now = datetime.now(UTC)
        status: int | None = None
        error = ""
        excerpt = ""
        wait: float | None = None
        if job is None:
            self._record(row, "failed", None, now, None, "the payload is no job", "", False, False)
            return
        if not row.secret:
            self._record(
                row, "failed", None, now, None, "no signing key for this endpoint", "", False, False
            )
            return
        data = body(row.event_type, row.occurred_at, job, urls)
        keys = tuple(
            signing.key_of(secret) for secret in (row.secret, row.previous_secret) if secret
        )
        stamp = int(time.time())
        try:
            answer = await self._client.post(
                row.url, signing.headers(keys, row.message_id, stamp, data), data
            )
        except OutboundRefused as refused:
            # The guard's answer does not change by waiting: failed, with why.
            self._record(
                row, "failed", None, now, None, f"{refused.cause}: {refused}", "", False, False
            )
            self._warn(row, refused.cause)
            return
        except OutboundFailed as failed:
            error = f"{failed.cause}: {failed}"
            self._warn(row, failed.cause)
        else:
            status = answer.status
            excerpt = _excerpt(answer)
            wait = retry_after(answer.headers.get("retry-after"), now)
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        outcome = verdict(self._settings, row.attempts, status, wait, now, self._rng)
        self._record(
            row,
            outcome.state,
            outcome.next_attempt_at,
            now,
            status,
            error,
            excerpt,
            outcome.ok,
            outcome.gone,
        )

    def _record(
        self,
        row: Claimed,
        state: str,
        next_attempt_at: datetime | None,
        attempted_at: datetime,
        status: int | None,
        error: str,
        excerpt: str,
        ok: bool,
        gone: bool,
    ) -> None:
        ATTEMPTS.labels("retried" if state == "pending" else state).inc()
        self._results.append(
            Attempted(
                row.delivery_id,
                row.claimed_until,
                row.endpoint_id,
                state,
                next_attempt_at,
                attempted_at,
                status,
                error[:EXCERPT],
                excerpt,
                ok,
                gone,
                row.failing,
            )
        )
        self._results_ready.set()

    def _warn(self, row: Claimed, cause: str) -> None:
        skipped = self._log.admit(f"{row.endpoint_id}:{cause}")
        if skipped is not None:
            log.warning(
                "webhook_attempt_failed", endpoint_id=row.endpoint_id, cause=cause, skipped=skipped
            )

    # --- recording ----------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._results_ready.wait()
            # No wait for more outcomes: an outcome's slot is not free again (for the
            # endpoint's next delivery) until it is recorded. Outcomes arriving while a
            # statement runs join the next one, so the batches grow with the rate.
            await asyncio.sleep(0)  # the attempts already answered append theirs first
            self._results_ready.clear()
            if not await self._flush():
                await asyncio.sleep(self._retry_delay())
                self._results_ready.set()

    async def _flush(self) -> bool:
        if not self._results:
            return True
        taken, self._results = self._results, []
        try:
            async with driver_connection(self._engine) as connection:
                disabled = await store.record(
                    connection, taken, self._settings.disable_after_seconds
                )
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            # Kept for the next try (a claim that lapses meanwhile records nothing: that
            # delivery goes again).
            self._results = taken + self._results
            self._failed(outage.dependency, outage.kind)
            return False
        self.recorded += len(taken)
        for endpoint_id, reason in disabled:
            DISABLED.labels(reason).inc()
            log.warning("webhook_endpoint_disabled", endpoint_id=endpoint_id, reason=reason)
        self._room.set()
        return True

    async def _drain(self) -> None:
        """Lets attempts in flight finish until the stop's deadline; the rest are
        cancelled (their claims lapse, and they go again)."""
        if not self._in_flight:
            return
        loop = asyncio.get_running_loop()
        deadline = getattr(self, "_deadline", loop.time())
        pending = set(self._in_flight)
        _, late = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _prune_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_PERIOD
        try:
            async with driver_connection(self._engine) as connection:
                await store.prune(connection, self._settings.retention_seconds, PRUNE_BATCH)
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise


def _excerpt(answer: Answer) -> str:
    return answer.body[: EXCERPT * 4].decode("utf-8", "replace")[:EXCERPT]
