"""Where a queued job stands: how many jobs a worker takes before it, and when it is
expected to start (fal's ``queue_position``), at a bounded cost per read.

The position is two index-only ranges of ``ix_jobs_claim_queue`` (queued jobs in claim
order: priority desc, next attempt, age, id) per queued job read, each capped at
:data:`CAP` rows: the jobs of higher priority that are due now, and the jobs of the same
priority ahead of it in claim order. A read never counts the whole queue; a page of
ListJobs with several queued jobs asks for all of them in one statement. notify's streams
ask by job id (:meth:`QueueStanding.of_ids`, at most :data:`IDS_LIMIT` a statement): the
same two ranges per job, after a primary-key read of each.

The start estimate divides the position by the recent claim rate: the claims among the
newest :data:`RATE_EVENTS` job events (the primary key's end, walked backwards) within
the last :data:`RATE_WINDOW_SECONDS`, read at most every :data:`RATE_REFRESH_SECONDS` per
process (on demand, by the first read that finds it stale: no background task). The
rate's age is the event loop's clock; the estimate's instants the service's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.kit.db import DriverStatement, driver_fetch
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

CAP = 1000  # the statements below spell it out
RATE_EVENTS = 3000
RATE_WINDOW_SECONDS = 300.0
RATE_REFRESH_SECONDS = 10.0
# The most job ids one of_ids statement places (QueueStandingService's bound).
IDS_LIMIT = 200


def _ahead(now: str) -> str:
    """How many queued jobs a worker takes before job ``t``: two capped counts over
    ix_jobs_claim_queue, index-only (``now``: the parameter holding the instant)."""
    return f"""
  (SELECT count(*) FROM (
     SELECT 1 FROM creation.jobs q
     WHERE q.status = 'queued' AND q.priority > t.priority AND q.next_attempt_at <= {now}
     LIMIT 1000) higher)
  + (SELECT count(*) FROM (
     SELECT 1 FROM creation.jobs q
     WHERE q.status = 'queued' AND q.priority = t.priority
       AND (q.next_attempt_at, q.created_at, q.job_id)
         < (t.next_attempt_at, t.created_at, t.job_id)
     LIMIT 1000) same) AS ahead"""  # noqa: S608 (a parameter's name, ours)


# Per queued job the read holds (unnest).
_AHEAD = DriverStatement(
    f"""
SELECT t.job_id::text AS job_id, {_ahead("$5")}
FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::timestamptz[])
  AS t(job_id, priority, next_attempt_at, created_at)
""",  # noqa: S608 (our own fragment)
    ("job_ids", "priorities", "next_attempts", "created", "now"),
)

# Per job id that is queued now (pk_jobs, then the same counts).
_AHEAD_OF_IDS = DriverStatement(
    f"""
SELECT t.job_id::text AS job_id, t.version, t.next_attempt_at, {_ahead("$2")}
FROM creation.jobs t
WHERE t.job_id = ANY($1::uuid[]) AND t.status = 'queued'
""",  # noqa: S608 (our own fragment)
    ("job_ids", "now"),
)

# Claims (an event into RUNNING) among the newest events, within the window.
_CLAIM_RATE = DriverStatement(
    """
SELECT count(*) FILTER (WHERE to_status = 'running') AS claims,
       min(created_at) AS oldest, count(*) AS seen
FROM (SELECT to_status, created_at FROM creation.job_events
      ORDER BY event_id DESC LIMIT 3000) recent
WHERE created_at > $1
""",
    ("since",),
)


@dataclass(frozen=True)
class Standing:
    position: int
    estimated_start: datetime | None


@dataclass(frozen=True)
class PlacedJob:
    """A queued job's standing with the version it was read at (of_ids)."""

    job_id: str
    version: int
    standing: Standing


class QueueStanding:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._rate: float | None = None  # claims per second; None: none lately
        self._rate_read_at: float | None = None  # the loop's clock
        self._refreshing: asyncio.Task[None] | None = None
        self._log = Throttle()

    async def of(self, jobs: Sequence[Job], now: datetime) -> Mapping[str, Standing]:
        """The standing of each QUEUED job among ``jobs``, by id; none when the database
        could not say in time (a read never fails for it)."""
        queued = [j for j in jobs if j.status is Status.QUEUED]
        if not queued:
            return {}
        try:
            rows, rate = await asyncio.gather(
                driver_fetch(
                    self._engine,
                    _AHEAD,
                    job_ids=[j.job_id for j in queued],
                    priorities=[j.priority for j in queued],
                    next_attempts=[j.next_attempt_at for j in queued],
                    created=[j.created_at for j in queued],
                    now=now,
                ),
                self._claim_rate(now),
            )
        except Exception as error:
            outage = classify(error)
            if outage is None:
                raise
            if self._log.admit(outage.kind) is not None:
                log.warning("queue_standing_unavailable", dependency=outage.kind)
            return {}
        by_id = {j.job_id: j for j in queued}
        return {
            row["job_id"]: _standing(row["ahead"], by_id[row["job_id"]].next_attempt_at, rate, now)
            for row in rows
        }

    async def of_ids(self, job_ids: Sequence[str], now: datetime) -> list[PlacedJob]:
        """The standing of each of ``job_ids`` (at most IDS_LIMIT) that is QUEUED now;
        unknown and unqueued jobs are left out. Database failures are raised."""
        if len(job_ids) > IDS_LIMIT:
            raise ValueError(f"at most {IDS_LIMIT} job ids a statement")
        rows, rate = await asyncio.gather(
            driver_fetch(self._engine, _AHEAD_OF_IDS, job_ids=list(job_ids), now=now),
            self._claim_rate(now),
        )
        return [
            PlacedJob(
                row["job_id"],
                int(row["version"]),
                _standing(row["ahead"], row["next_attempt_at"], rate, now),
            )
            for row in rows
        ]

    async def _claim_rate(self, now: datetime) -> float | None:
        loop = asyncio.get_running_loop()
        fresh = (
            self._rate_read_at is not None
            and loop.time() - self._rate_read_at < RATE_REFRESH_SECONDS
        )
        if not fresh:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._read_rate(now))
            # Shielded: one read serves every call waiting for it, even if one is cancelled.
            await asyncio.shield(self._refreshing)
        return self._rate

    async def _read_rate(self, now: datetime) -> None:
        since = now - timedelta(seconds=RATE_WINDOW_SECONDS)
        (row,) = await driver_fetch(self._engine, _CLAIM_RATE, since=since)
        claims = int(row["claims"])
        if claims == 0:
            self._rate = None
        else:
            # The window the events cover: all of it unless the newest events ran out
            # before its start (a busy queue: they cover less).
            full = int(row["seen"]) < RATE_EVENTS
            covered = RATE_WINDOW_SECONDS if full else (now - row["oldest"]).total_seconds()
            self._rate = claims / max(covered, 1.0)
        self._rate_read_at = asyncio.get_running_loop().time()


def _standing(ahead: int, next_attempt_at: datetime, rate: float | None, now: datetime) -> Standing:
    position = min(int(ahead), CAP)
    estimate = None
    if rate is not None:
        start = now + timedelta(seconds=(position + 1) / rate)
        estimate = max(start, next_attempt_at)
    return Standing(position, estimate)
