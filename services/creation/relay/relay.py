"""The outbox relay, a component any number of creation processes run.

Each round takes a batch of undelivered rows with ``FOR UPDATE SKIP LOCKED`` (replicas
take different rows and never wait on each other) and marks it delivered in the same
statement, delivers it to notify's ``Deliver``, and commits only then: a row counts as
delivered only once notify has committed it, and a relay that dies mid-batch leaves its
rows for the next. Delivery is therefore at least once; notify's version gate makes
duplicates harmless. A row records what changed (the job and its version), not the job:
the take statement reads each job of the batch once and builds its message from the
job's row as it stands (``store/outbox.py``), so a job's versions in one batch go out as
one message, its newest state; the gate makes a superseded version's message redundant.
The round runs on the pool's asyncpg connection directly (no SQLAlchemy per statement),
and messages are read without ``json_format.ParseDict`` (``jobs.py``): the relay runs in
every creation process, beside SubmitJob.

A NOTIFY on ``creation_outbox`` (a trigger sends it at the commit of every outbox insert)
wakes the relay; a poll is the fallback. While notify (or the database) is away the relay
retries with exponential backoff and full jitter, logging one throttled line per kind of
failure, and says once when deliveries flow again. Now and then it prunes delivered rows
older than the retention period, and the other tables it is given (``prunings``: the
remote workers' claims and answers), each after its own retention.

While tracing is on, each message carries its job's submit trace context (notify's span
for it joins the job's trace), and each Deliver is a span of its own linked to those
traces: a batch holds many jobs' messages, and a span has one parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from google.protobuf import json_format
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.notify.v1 import notify_ingest_service_pb2 as pb
from services.creation.domain import backoff
from services.creation.relay.jobs import read_job
from services.creation.relay.notify_client import DeliveryFailed
from services.creation.relay.pruning import Pruning
from services.creation.settings import RelaySettings
from services.creation.store import outbox
from services.creation.store.outbox import OUTBOX_CHANNEL
from services.kit import tracing
from services.kit.clock import Clock, system_clock
from services.kit.db import driver_connection
from services.kit.listen import Listener
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify, log_unavailable

log = get_logger(__name__)

# Delivered rows deleted per prune statement (short transactions, however much is due).
PRUNE_BATCH = 1000


class Notify(Protocol):
    async def deliver(self, messages: list[pb.OutboxMessage]) -> int: ...


class OutboxRelay:
    name = "outbox-relay"

    def __init__(
        self,
        engine: AsyncEngine,
        notify: Notify,
        settings: RelaySettings,
        database_url: str,
        *,
        clock: Clock = system_clock,
        throttle: Throttle | None = None,
        rng: random.Random | None = None,
        prunings: Sequence[Pruning] = (),
    ) -> None:
        self._engine = engine
        self._prunings = (
            Pruning("outbox", settings.retention_seconds, outbox.prune),
            *prunings,
        )
        self._notify = notify
        self._settings = settings
        self._clock = clock
        self._log = throttle or Throttle()
        self._rng = rng
        self.listener = Listener(database_url, OUTBOX_CHANNEL)
        self._stopping = asyncio.Event()
        self._failures = 0  # consecutive failed rounds
        self._next_prune = 0.0
        self._round_started = float("-inf")
        # Fault injection (tests): the previous batch, to be delivered once more, late.
        self._late: list[pb.OutboxMessage] = []
        # For tests and metrics: rows this replica marked delivered, the job messages it
        # sent for them (fewer: a job's versions in one batch go as one), Deliver calls.
        self.delivered = 0
        self.messages = 0
        self.calls = 0
        self._traced = False

    async def run(self) -> None:
        self._traced = tracing.tracer() is not None
        listening = asyncio.create_task(self.listener.run(), name=self.listener.name)
        log.info("relay_started", batch=self._settings.batch, fault=self._settings.fault)
        try:
            while not self._stopping.is_set():
                if listening.done():
                    listening.result()
                    raise RuntimeError("the outbox listener ended on its own")
                if await self._round():
                    await self._prune_if_due()
                    await self._wait_for_rows(listening)
                    await self._space_rounds()
                else:
                    await self._sleep(self._retry_delay())
        finally:
            await self.listener.stop(0)
            await asyncio.gather(listening, return_exceptions=True)
            log.info("relay_stopped", delivered=self.delivered)

    @property
    def failed_rounds(self) -> int:
        """Rounds that failed in a row (0 while deliveries flow)."""
        return self._failures

    async def stop(self, deadline: float) -> None:
        # A batch in flight finishes (its Deliver has a deadline); none starts after.
        self._stopping.set()

    # --- one round: batches until the queue is empty ------------------------------------

    async def _round(self) -> bool:
        """Delivers batches until one comes back short; False after a failure."""
        self._round_started = asyncio.get_running_loop().time()
        try:
            while not self._stopping.is_set():
                taken = await self._deliver_batch()
                if taken < self._settings.batch:
                    break
            await self._deliver_late()
        except DeliveryFailed as failed:
            self._failed("notify", failed.failure.reason, failed.failure.transient)
            return False
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            self._failed(outage.dependency, outage.kind, transient=True)
            return False
        if self._failures:
            log.info("relay_delivering_again", failed_rounds=self._failures)
            self._failures = 0
        return True

    async def _deliver_batch(self) -> int:
        # One statement takes and marks the batch, in a transaction that commits only
        # once notify has it (BEGIN, the statement, COMMIT: three round trips a batch).
        refused: DeliveryFailed | None = None
        async with driver_connection(self._engine) as connection:
            transaction = connection.transaction()
            await transaction.start()
            try:
                taken = await outbox.take(
                    connection, self._clock(), self._settings.batch, self._traced
                )
                messages = [m for m in map(_message, taken) if m is not None]
                if messages:
                    await self._send(messages)
            except DeliveryFailed as failed:
                # notify's answer, not the connection's: undo the marks, keep the
                # connection.
                refused = failed
                await transaction.rollback()
            except BaseException:
                # The failure is what counts; a connection that cannot even roll back is
                # discarded by driver_connection (the server ends the transaction).
                with contextlib.suppress(Exception):
                    await transaction.rollback()
                raise
            else:
                await transaction.commit()
        if refused is not None:
            raise refused
        rows = sum(job.rows for job in taken)
        self.delivered += rows
        self.messages += len(messages)
        return rows

    async def _send(self, messages: list[pb.OutboxMessage]) -> None:
        if self._settings.fault != "duplicate_reversed":
            await self._call(messages)
            return
        # Every batch twice and out of order: reversed now, and once more after the next
        # batch went out, so older versions reach notify after newer ones.
        await self._call(list(reversed(messages)))
        await self._deliver_late()
        self._late = messages

    async def _deliver_late(self) -> None:
        if self._late:
            await self._call(self._late)
            self._late = []

    async def _call(self, messages: list[pb.OutboxMessage]) -> None:
        self.calls += 1
        if not self._traced:
            await self._notify.deliver(messages)
            return
        links = [link for m in messages if (link := tracing.link_to(m.traceparent))]
        with tracing.span_in_trace(
            "outbox deliver",
            None,
            kind=SpanKind.PRODUCER,
            attributes={"messaging.batch.message_count": len(messages)},
            links=links,
        ):
            await self._notify.deliver(messages)

    # --- failures -----------------------------------------------------------------------

    def _failed(self, dependency: str, kind: str, transient: bool) -> None:
        self._failures += 1
        if transient:
            log_unavailable(self._log, dependency, kind, component=self.name)
        elif self._log.admit(f"refused:{kind}") is not None:
            # Not an outage: notify refuses what we send (a bad credential, a bug). The
            # rows stay queued and are tried again; an operator must look.
            log.error("relay_delivery_refused", reason=kind)

    def _retry_delay(self) -> float:
        settings = self._settings
        delay = backoff(
            self._failures, settings.backoff_base_seconds, settings.backoff_max_seconds, self._rng
        )
        return delay.total_seconds()

    # --- waiting and pruning ------------------------------------------------------------

    async def _wait_for_rows(self, listening: asyncio.Task[None]) -> None:
        waiters: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self._stopping.wait()),
            asyncio.ensure_future(self.listener.woken(self._settings.poll_seconds)),
        ]
        try:
            await asyncio.wait([*waiters, listening], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _space_rounds(self) -> None:
        """Under load (woken again soon after a round began), lets rows gather until the
        spacing has passed: every round costs a transaction here and a Deliver, with its
        transaction, in notify, however few rows it carries."""
        loop = asyncio.get_running_loop()
        remaining = self._round_started + self._settings.round_spacing_seconds - loop.time()
        if remaining > 0:
            await self._sleep(remaining)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _prune_if_due(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_prune:
            return
        self._next_prune = loop.time() + self._settings.prune_period_seconds
        now = self._clock()
        try:
            for pruning in self._prunings:
                before = now - timedelta(seconds=pruning.retention_seconds)
                while not self._stopping.is_set():
                    if await pruning.prune(self._engine, before, PRUNE_BATCH) < PRUNE_BATCH:
                        break
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            log_unavailable(self._log, outage.dependency, outage.kind, component=self.name)


def _message(job: outbox.OutboxJob) -> pb.OutboxMessage | None:
    """The job's message as notify takes it; None (logged) for a message that is no
    Job (a row written by hand that job_message cannot make one of): it can never be
    delivered, so its rows are marked delivered rather than block the queue."""
    message = pb.OutboxMessage(outbox_id=job.outbox_id, traceparent=job.trace_parent or "")
    try:
        read_job(job.payload, message.job)
    except json_format.ParseError:
        log.error("outbox_row_unreadable", outbox_id=job.outbox_id)
        return None
    return message
