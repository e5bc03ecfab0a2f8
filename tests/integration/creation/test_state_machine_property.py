"""A property test: random sequences of submit, cancel, claim, heartbeat, submit-to-
provider, complete, fail, stale writes, reaping and operator decisions, against a model
of the state machine. After every step the database must agree with the model: statuses,
versions (one per change, one outbox row each), the audit trail, and every user's points
(grants - captures - open reservations)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import TERMINAL, Status
from services.creation.errors import InsufficientPoints, JobAlreadyFinished
from services.creation.store import admin, leases, ledger
from services.creation.store import jobs as store
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.jobs import SubmitLimits
from services.creation.tables import job_events, jobs, outbox
from services.kit import migrations
from services.kit.db import asyncpg_url
from tests.integration.creation.helpers import T0, command
from tests.support.fenced import fenced_write

PRICE = 5  # stub-fast
WELCOME = 12  # enough for two jobs, so running out of points happens often
TTL = timedelta(seconds=30)
LIMITS = SubmitLimits(
    daily_quota=10_000, in_flight_limit=10_000, max_attempts=2, welcome_points=WELCOME
)
ASSET = "5b1f0a52-3c4d-4e8f-9a0b-1c2d3e4f5a6b"


@dataclass
class ModelJob:
    user: str
    status: Status = Status.QUEUED
    version: int = 1
    events: int = 1  # the submit event, then one per status change or cancel request
    cancel_requested: bool = False
    epoch: int = 0
    step: str | None = None
    has_request: bool = False
    attempt: int = 0
    max_attempts: int = LIMITS.max_attempts
    progress: int = 0
    ledger: list[str] = field(default_factory=lambda: ["reserve"])

    def change(self, status: Status | None = None) -> None:
        assert self.status not in TERMINAL, "a terminal job changed"
        self.version += 1
        if status is not None and status is not self.status:
            self.status = status
            self.events += 1
            if status is Status.SUCCEEDED:
                self.ledger.append("capture")
            elif status in (Status.FAILED, Status.CANCELLED):
                self.ledger.append("release")


def build_machine(database_url: str) -> type[RuleBasedStateMachine]:
    class JobLifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.engine: AsyncEngine = create_async_engine(asyncpg_url(database_url), pool_size=2)
            run = uuid.uuid4().hex[:8]
            self.users = [f"prop-{run}-{i}" for i in range(3)]
            self.jobs: dict[str, ModelJob] = {}
            self.time = T0
            # Claims and the reaper see the whole table: each example starts from empty.
            self.run(self._empty_tables())

        async def _empty_tables(self) -> None:
            async with self.engine.begin() as connection:
                await connection.execute(
                    text(
                        "TRUNCATE creation.jobs, creation.job_events, creation.outbox,"
                        " creation.points_ledger, creation.output_purges,"
                        " creation.remote_claims, creation.remote_calls"
                    )
                )

        def now(self) -> datetime:
            """A second later at every call: time only moves forward."""
            self.time += timedelta(seconds=1)
            return self.time

        def run(self, coroutine):  # type: ignore[no-untyped-def]
            return self.loop.run_until_complete(coroutine)

        def teardown(self) -> None:
            self.run(self.engine.dispose())
            self.loop.close()

        def with_status(self, *statuses: Status) -> list[str]:
            return [j for j, m in self.jobs.items() if m.status in statuses]

        def balance(self, user: str) -> tuple[int, int]:
            """(available, reserved) by the model. The welcome grant lands with a user's
            first job (a refused submit rolls it back), and it always covers one job."""
            mine = [m for m in self.jobs.values() if m.user == user]
            captured = sum(PRICE for m in mine if "capture" in m.ledger)
            open_reserved = sum(PRICE for m in mine if len(m.ledger) == 1)
            return WELCOME - captured - open_reserved, open_reserved

        # --- users --------------------------------------------------------------------

        @rule(user=st.integers(0, 2))
        def submit(self, user: int) -> None:
            user_id = self.users[user]
            expected_ok = self.balance(user_id)[0] >= PRICE
            try:
                made = self.run(store.submit(self.engine, user_id, command(), LIMITS, self.now()))
            except InsufficientPoints:
                assert not expected_ok
                return
            assert expected_ok
            assert (made.job.status, made.job.version) == (Status.QUEUED, 1)
            self.jobs[made.job.job_id] = ModelJob(user=user_id)

        @precondition(lambda self: bool(self.jobs))
        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            job_id = data.draw(st.sampled_from(list(self.jobs)))
            model = self.jobs[job_id]
            try:
                self.run(store.cancel(self.engine, model.user, job_id, self.now()))
            except JobAlreadyFinished:
                assert model.status in (Status.SUCCEEDED, Status.FAILED)
                return
            if model.status is Status.CANCELLED or model.cancel_requested:
                return
            if model.status is Status.QUEUED:
                model.change(Status.CANCELLED)
            else:
                model.cancel_requested = True
                model.events += 1  # the request is an event naming who asked
                model.change()

        # --- workers ------------------------------------------------------------------

        @rule(limit=st.integers(1, 3))
        def claim(self, limit: int) -> None:
            due = self.with_status(Status.QUEUED)
            claimed = self.run(leases.claim(self.engine, "w", limit, TTL, self.now()))
            assert len(claimed) == min(limit, len(due))
            for job in claimed:
                model = self.jobs[job.job_id]
                assert model.status is Status.QUEUED
                model.change(Status.RUNNING)
                model.epoch += 1
                if not model.has_request:
                    model.attempt += 1
                    model.step = "preparing"
                    model.progress = 0
                assert (job.lease_epoch, job.attempt) == (model.epoch, model.attempt)

        def pick_running(self, data: st.DataObject) -> tuple[str, ModelJob]:
            job_id = data.draw(st.sampled_from(self.with_status(Status.RUNNING)))
            return job_id, self.jobs[job_id]

        @precondition(lambda self: bool(self.with_status(Status.RUNNING)))
        @rule(data=st.data(), progress=st.integers(0, 99))
        def heartbeat(self, data: st.DataObject, progress: int) -> None:
            job_id, model = self.pick_running(data)
            got = self.run(
                leases.heartbeat(self.engine, job_id, model.epoch, TTL, self.now(), progress)
            )
            assert got is not None
            if progress != model.progress:
                model.progress = progress
                model.change()

        @precondition(lambda self: bool(self.with_status(Status.RUNNING)))
        @rule(data=st.data())
        def provider_submit(self, data: st.DataObject) -> None:
            job_id, model = self.pick_running(data)
            if model.has_request:
                return
            if model.step != "submitting":
                assert self.run(
                    fenced_write(
                        self.engine, FencedWrite.MARK_SUBMITTING, job_id, model.epoch, self.now()
                    )
                )
                model.step = "submitting"
                model.change()
            if data.draw(st.booleans()):  # the provider answered before any crash
                assert self.run(
                    fenced_write(
                        self.engine,
                        FencedWrite.RECORD_REQUEST,
                        job_id,
                        model.epoch,
                        self.now(),
                        f"req-{job_id}",
                    )
                )
                model.step, model.has_request = "generating", True
                model.change()

        @precondition(lambda self: bool(self.with_status(Status.RUNNING)))
        @rule(data=st.data())
        def complete(self, data: st.DataObject) -> None:
            job_id, model = self.pick_running(data)
            done = self.run(
                fenced_write(
                    self.engine,
                    FencedWrite.COMPLETE,
                    job_id,
                    model.epoch,
                    self.now(),
                    outputs_value([ASSET]),
                )
            )
            if model.cancel_requested:
                # An output that lands after a cancel is never attached.
                assert done is None
                return
            assert done is not None
            model.change(Status.SUCCEEDED)

        @precondition(lambda self: bool(self.with_status(Status.RUNNING)))
        @rule(data=st.data(), retryable=st.booleans())
        def fail(self, data: st.DataObject, retryable: bool) -> None:
            job_id, model = self.pick_running(data)
            got = self.run(
                leases.fail(
                    self.engine,
                    job_id,
                    model.epoch,
                    "PROVIDER_ERROR",
                    "boom",
                    retryable=retryable,
                    retry_delay=timedelta(0),
                    now=self.now(),
                )
            )
            assert got is not None
            if retryable and model.attempt < model.max_attempts and not model.cancel_requested:
                model.change(Status.QUEUED)
                model.step, model.has_request = None, False
            else:
                model.change(Status.FAILED)

        @precondition(
            lambda self: any(
                m.cancel_requested for m in self.jobs.values() if m.status is Status.RUNNING
            )
        )
        @rule(data=st.data())
        def acknowledge_cancel(self, data: st.DataObject) -> None:
            job_id = data.draw(
                st.sampled_from(
                    [j for j in self.with_status(Status.RUNNING) if self.jobs[j].cancel_requested]
                )
            )
            model = self.jobs[job_id]
            assert self.run(
                fenced_write(
                    self.engine, FencedWrite.ACKNOWLEDGE_CANCEL, job_id, model.epoch, self.now()
                )
            )
            model.change(Status.CANCELLED)

        @precondition(lambda self: bool(self.jobs))
        @rule(data=st.data())
        def stale_worker_writes_nothing(self, data: st.DataObject) -> None:
            job_id = data.draw(st.sampled_from(list(self.jobs)))
            model = self.jobs[job_id]
            stale = model.epoch - 1 if model.status is Status.RUNNING else model.epoch
            assert (
                self.run(
                    fenced_write(
                        self.engine,
                        FencedWrite.COMPLETE,
                        job_id,
                        stale,
                        self.now(),
                        outputs_value([ASSET]),
                    )
                )
                is None
            )
            assert (
                self.run(leases.heartbeat(self.engine, job_id, stale, TTL, self.now(), 50)) is None
            )

        @rule()
        def reap(self) -> None:
            # A day later every lease has expired.
            self.time += timedelta(days=1)
            reaped = [r.job for r in self.run(leases.reap_decided(self.engine, self.now(), 1000))]
            assert {j.job_id for j in reaped} == set(self.with_status(Status.RUNNING))
            for job in reaped:
                model = self.jobs[job.job_id]
                if model.step == "submitting" and not model.has_request:
                    model.change(Status.NEEDS_ATTENTION)
                elif model.cancel_requested:
                    model.change(Status.CANCELLED)
                elif model.has_request:
                    model.change(Status.QUEUED)
                elif model.attempt < model.max_attempts:
                    model.change(Status.QUEUED)
                    model.step, model.progress = None, 0
                else:
                    model.change(Status.FAILED)
                assert job.status is model.status

        @precondition(lambda self: bool(self.with_status(Status.NEEDS_ATTENTION)))
        @rule(
            data=st.data(),
            decision=st.sampled_from(
                [admin.Decision.RETRY, admin.Decision.FAIL, admin.Decision.CANCEL]
            ),
        )
        def operator_resolves(self, data: st.DataObject, decision: str) -> None:
            job_id = data.draw(st.sampled_from(self.with_status(Status.NEEDS_ATTENTION)))
            model = self.jobs[job_id]
            self.run(admin.resolve(self.engine, job_id, decision, "op", "looked", self.now()))
            if decision == admin.Decision.RETRY:
                model.change(Status.QUEUED)
                model.step, model.has_request, model.cancel_requested = None, False, False
                model.max_attempts = max(model.max_attempts, model.attempt + 1)
            else:
                model.change(Status.FAILED if decision == admin.Decision.FAIL else Status.CANCELLED)

        # --- what must always hold --------------------------------------------------

        @invariant()
        def database_agrees(self) -> None:
            if not self.jobs:
                return

            async def read():  # type: ignore[no-untyped-def]
                async with self.engine.connect() as connection:
                    rows = (
                        await connection.execute(
                            select(
                                jobs.c.job_id,
                                jobs.c.status,
                                jobs.c.version,
                                jobs.c.cancel_requested,
                            ).where(jobs.c.job_id.in_(list(self.jobs)))
                        )
                    ).all()
                    versions = (
                        await connection.execute(
                            select(outbox.c.job_id, outbox.c.version).where(
                                outbox.c.job_id.in_(list(self.jobs))
                            )
                        )
                    ).all()
                    events = (
                        await connection.execute(
                            select(job_events.c.job_id).where(
                                job_events.c.job_id.in_(list(self.jobs))
                            )
                        )
                    ).all()
                return rows, versions, events

            rows, versions, events = self.run(read())
            for job_id, status, version, cancel_requested in rows:
                model = self.jobs[str(job_id)]
                assert (Status(status), version, cancel_requested) == (
                    model.status,
                    model.version,
                    model.cancel_requested,
                )
            per_job: dict[str, list[int]] = {}
            for job_id, version in versions:
                per_job.setdefault(str(job_id), []).append(version)
            for job_id, model in self.jobs.items():
                assert sorted(per_job[job_id]) == list(range(1, model.version + 1))
            event_counts: dict[str, int] = {}
            for (job_id,) in events:
                event_counts[str(job_id)] = event_counts.get(str(job_id), 0) + 1
            for job_id, model in self.jobs.items():
                assert event_counts[job_id] == model.events

        @invariant()
        def points_add_up(self) -> None:
            for user in {m.user for m in self.jobs.values()}:
                got = self.run(ledger.read_balance(self.engine, user, WELCOME, T0))
                assert (got.available, got.reserved) == self.balance(user)

    return JobLifecycle


def test_the_database_follows_the_state_machine(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)
    run_state_machine_as_test(
        build_machine(scratch_database),
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
