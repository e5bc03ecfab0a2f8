"""creation's database-derived gauges: the queue, jobs waiting for an operator, and the
outbox lag. Read on a timer by one component in the roles that own the queue (worker and
all); never on a scrape (see services/kit/readings.py)."""

from __future__ import annotations

from prometheus_client import Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store.backlog import read_backlog
from services.kit.readings import PeriodicReading

QUEUED = Gauge("atelier_jobs_queued", "Jobs in QUEUED, by priority", ["priority"])
QUEUED_DUE = Gauge(
    "atelier_jobs_queued_due",
    "Jobs in QUEUED whose next attempt is due now (the rest wait out a retry backoff)",
    ["priority"],
)
OLDEST_QUEUED_AGE = Gauge(
    "atelier_jobs_oldest_queued_age_seconds",
    "Seconds since the oldest job in QUEUED was submitted, by priority (0: none queued)",
    ["priority"],
)
NEEDS_ATTENTION = Gauge(
    "atelier_jobs_needs_attention", "Jobs in NEEDS_ATTENTION, waiting for an operator"
)
OUTBOX_UNDELIVERED = Gauge(
    "atelier_outbox_undelivered", "Outbox rows (job changes) not yet delivered to notify"
)
OUTBOX_OLDEST_AGE = Gauge(
    "atelier_outbox_oldest_undelivered_age_seconds",
    "Seconds since the oldest undelivered outbox row was written (0: none waits): how far "
    "behind watchers and pushes are",
)

READING = "backlog-gauges"


class BacklogGauges:
    """Sets the gauges from one reading. A priority seen once and gone since reads 0, so
    its series does not freeze at its last depth."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._priorities: set[int] = {0}

    async def read(self) -> None:
        backlog = await read_backlog(self._engine)
        levels = {level.priority: level for level in backlog.queue}
        self._priorities |= levels.keys()
        for priority in self._priorities:
            label = str(priority)
            level = levels.get(priority)
            QUEUED.labels(label).set(level.queued if level else 0)
            QUEUED_DUE.labels(label).set(level.due if level else 0)
            OLDEST_QUEUED_AGE.labels(label).set(level.oldest_age_seconds if level else 0)
        NEEDS_ATTENTION.set(backlog.needs_attention)
        OUTBOX_UNDELIVERED.set(backlog.outbox_undelivered)
        OUTBOX_OLDEST_AGE.set(backlog.outbox_oldest_age_seconds)


def backlog_reading(
    engine: AsyncEngine, period_seconds: float, deadline_seconds: float
) -> PeriodicReading:
    return PeriodicReading(READING, BacklogGauges(engine).read, period_seconds, deadline_seconds)
