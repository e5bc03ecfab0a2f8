"""creation worker processes beside an API stack, for acceptance tests: start them as
`atelier serve creation --role worker` does, queue jobs straight through the store, and
read what happened from the database and the stub's ledger."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.store import jobs as store
from services.creation.store.jobs import SubmitLimits
from services.creation.store.rows import job_from_row
from services.creation.submission import validate
from services.creation.tables import job_events, jobs, points_ledger
from services.dev.processes import Child, free_port, grpc_serving, spawn
from services.dev.stack import Stack
from services.kit.clock import system_clock
from services.media.tables import assets

T = TypeVar("T")


@dataclass
class WorkerProcess:
    """One `atelier serve creation --role worker` child and where its health answers."""

    child: Child
    internal_address: str
    # Where its /metrics answers.
    metrics_port: int = 0

    @property
    def name(self) -> str:
        return self.child.name

    def send(self, signal_number: int) -> None:
        self.child.process.send_signal(signal_number)

    def stop(self) -> int:
        """SIGTERM (a drain), then its exit code."""
        return self.child.stop(timeout=30)


def start_worker(api: Stack, name: str, env: Mapping[str, str]) -> WorkerProcess:
    """A worker process on ``api``'s database and media, sharing the stub's state
    directory (so any worker can poll any request); ``env`` adds the test's settings."""
    ports = {
        f"ATELIER_CREATION_{kind}_PORT": str(free_port())
        for kind in ("PUBLIC", "INTERNAL", "METRICS")
    }
    full = {
        "ATELIER_ENV": "test",
        "ATELIER_DATABASE_URL": api.database_url,
        **ports,
        "ATELIER_MEDIA_INTERNAL_ADDRESS": f"127.0.0.1:{api.ports.internal['media']}",
        "ATELIER_STUB_STATE_DIR": str(api.work_dir / "stub"),
        **env,
    }
    argv = [sys.executable, "-m", "services.creation", "--role", "worker"]
    child = spawn(name, argv, full, api.work_dir / "logs")
    return WorkerProcess(
        child,
        f"127.0.0.1:{ports['ATELIER_CREATION_INTERNAL_PORT']}",
        int(ports["ATELIER_CREATION_METRICS_PORT"]),
    )


async def until(
    probe: Callable[[], Awaitable[T | None]], within: float, what: str, every: float = 0.05
) -> T:
    """``probe``'s first answer that is not None; fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        found = await probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {within:g} s"
        await asyncio.sleep(every)


async def serving(worker: WorkerProcess, within: float = 30.0) -> None:
    """Returns once the worker's internal health says SERVING (its engine is running)."""
    check = grpc_serving(worker.internal_address)

    async def probe() -> bool | None:
        child = worker.child
        assert child.alive(), f"{child.name} exited\n{child.log_tail()}"
        return True if await asyncio.to_thread(check) else None

    await until(probe, within, f"{worker.name} serving", every=0.1)


async def exited(worker: WorkerProcess, within: float) -> int:
    """The worker's exit code once it has exited; fails after ``within`` seconds."""

    async def probe() -> int | None:
        code = worker.child.process.poll()
        return None if code is None else int(code)

    return await until(probe, within, f"{worker.name} exited")


def log_lines(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The worker's JSON log lines so far (other output is skipped)."""
    path = worker.child.log_path
    if path is None or not path.exists():
        return []
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line still being written
    return lines


def seconds_between(worker: WorkerProcess, first: str, then: str) -> float:
    """Seconds from the worker's first log line with action ``first`` to its first with
    action ``then``, by the worker's own clock."""
    times: dict[str, datetime] = {}
    for line in log_lines(worker):
        if line.get("action") in (first, then):
            times.setdefault(line["action"], datetime.fromisoformat(line["time"]))
    assert first in times and then in times, f"{worker.name} logged no {first} or {then}"
    return (times[then] - times[first]).total_seconds()


async def worker_id(worker: WorkerProcess, within: float = 10.0) -> str:
    """The id the worker writes as its lease owner, from its start line."""

    async def probe() -> str | None:
        for line in log_lines(worker):
            if line.get("action") == "worker_started":
                return str(line["worker_id"])
        return None

    return await until(probe, within, f"{worker.name}'s start line")


@dataclass(frozen=True)
class Queued:
    user_id: str
    job_id: str


async def queue_jobs(
    db: AsyncEngine,
    users_with_inputs: Mapping[str, str],
    per_user: int,
    model_id: str = "stub-fast",
) -> list[Queued]:
    """``per_user`` jobs of ``model_id`` for each user (user id -> input asset id),
    straight through the store (the API's own submit), users in parallel. Each user's
    welcome points must cover them (100 points at stub-fast's price of 5: at most 20)."""
    limits = SubmitLimits(
        daily_quota=per_user, in_flight_limit=per_user, max_attempts=3, welcome_points=100
    )

    async def for_user(user_id: str, asset_id: str) -> list[Queued]:
        made = []
        for _ in range(per_user):
            command, problems = validate(
                idempotency_key=None,
                model_id=model_id,
                style_id="watercolor",
                input_asset_id=asset_id,
                prompt="a fox in the snow",
                negative_prompt="",
                width=512,
                height=512,
                parameters={"seed": 3},
            )
            assert command is not None, problems
            submitted = await store.submit(db, user_id, command, limits, system_clock())
            made.append(Queued(user_id, submitted.job.job_id))
        return made

    batches = await asyncio.gather(*(for_user(u, a) for u, a in users_with_inputs.items()))
    return [queued for batch in batches for queued in batch]


async def all_finished(
    db: AsyncEngine, workers: Iterable[WorkerProcess], within: float, job_ids: Iterable[str] = ()
) -> None:
    """Returns once no job (of ``job_ids``, when given) is queued or running; fails after
    ``within`` seconds, or at once when a worker died."""
    only = list(job_ids)
    query = (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.status.in_([Status.QUEUED.value, Status.RUNNING.value]))
    )
    if only:
        query = query.where(jobs.c.job_id.in_(only))
    alive = list(workers)

    async def probe() -> bool | None:
        async with db.connect() as connection:
            left = (await connection.execute(query)).scalar_one()
        for worker in alive:
            assert worker.child.alive(), worker.child.log_tail()
        return True if left == 0 else None

    await until(probe, within, "every job finished", every=0.25)


def new_user(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def read_jobs(db: AsyncEngine, job_ids: Iterable[str]) -> dict[str, Job]:
    async with db.connect() as connection:
        rows = (
            await connection.execute(select(jobs).where(jobs.c.job_id.in_(list(job_ids))))
        ).all()
    return {str(r.job_id): job_from_row(r._mapping) for r in rows}


@dataclass(frozen=True)
class Event:
    version: int
    from_status: str | None
    to_status: str
    actor_kind: str
    actor_id: str
    reason: str


async def read_events(db: AsyncEngine, job_ids: Iterable[str]) -> dict[str, list[Event]]:
    """Each job's status changes, in version order."""
    async with db.connect() as connection:
        rows = (
            await connection.execute(
                select(job_events)
                .where(job_events.c.job_id.in_(list(job_ids)))
                .order_by(job_events.c.job_id, job_events.c.version)
            )
        ).all()
    events: dict[str, list[Event]] = defaultdict(list)
    for r in rows:
        events[str(r.job_id)].append(
            Event(r.version, r.from_status, r.to_status, r.actor_kind, r.actor_id, r.reason)
        )
    return dict(events)


async def read_points(db: AsyncEngine, job_ids: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """Each job's points ledger entries (kind, amount), in order."""
    async with db.connect() as connection:
        rows = (
            await connection.execute(
                select(points_ledger.c.job_id, points_ledger.c.kind, points_ledger.c.amount)
                .where(points_ledger.c.job_id.in_(list(job_ids)))
                .order_by(points_ledger.c.entry_id)
            )
        ).all()
    entries: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for r in rows:
        entries[str(r.job_id)].append((r.kind, int(r.amount)))
    return dict(entries)


def output_ids(job: Job) -> list[str]:
    """The job's output asset ids."""
    return list(job.outputs)


async def output_assets(db: AsyncEngine, owners: Iterable[str]) -> dict[str, str]:
    """The ai_output assets media holds for ``owners``: asset id -> status."""
    async with db.connect() as connection:
        rows = (
            await connection.execute(
                select(assets.c.asset_id, assets.c.status).where(
                    assets.c.owner_user_id.in_(list(owners)), assets.c.purpose == "ai_output"
                )
            )
        ).all()
    return {str(r.asset_id): str(r.status) for r in rows}
