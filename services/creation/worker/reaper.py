"""The reaper: on a schedule, resolves running jobs whose lease expired (their worker
died or froze), by step — retry, resume polling, NEEDS_ATTENTION when a submit's outcome
is unknown, cancel. Safe with any number of replicas: each batch is taken with SKIP
LOCKED. A dead worker's job whose owner asked to cancel tells its provider first when the
provider holds a request. Each decision is an event by ``reaper``. Each sweep also deletes
the outputs listed for purging that a crashed worker could not delete itself.

Automatic recovery (``auto_adopt``, ATELIER_AUTO_ADOPT): a job this sweep sent to
NEEDS_ATTENTION whose adapter's lookup finds exactly one request for it is adopted at
once — back to polling that request, never a new submit. None found, several, or no
answer: it stays for a person to decide."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from prometheus_client import Counter, Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Job, ReapDecision
from services.creation.errors import JobCancelRequested, JobNotAwaitingOperator
from services.creation.media_client import MediaClient
from services.creation.provider_requests import ProviderRequests
from services.creation.providers.base import Provider, ProviderError
from services.creation.store import admin as admin_store
from services.creation.store import leases
from services.creation.worker import output_purger
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify

log = get_logger(__name__)

DECISIONS = Counter(
    "atelier_reaper_decisions",
    "Expired leases the reaper resolved (one per job whose worker died or froze), by "
    "decision: retry, resume, attention (now NEEDS_ATTENTION), fail, cancel",
    ["decision"],
)
_DECIDED = {decision: DECISIONS.labels(decision.value) for decision in ReapDecision}
ADOPTIONS = Counter(
    "atelier_reaper_adoptions",
    "NEEDS_ATTENTION jobs the reaper adopted on its own (automatic recovery): the lookup"
    " found exactly one provider request for the job",
)
LAST_SWEEP = Gauge(
    "atelier_reaper_last_sweep_timestamp_seconds",
    "Unix time the reaper of this process last completed a sweep",
)

BATCH = 100
PROVIDER_CANCEL_TIMEOUT_SECONDS = 5.0


class Reaper:
    name = "reaper"

    def __init__(
        self,
        engine: AsyncEngine,
        providers: Mapping[str, Provider],
        period_seconds: float,
        *,
        clock: Clock = system_clock,
        batch: int = BATCH,
        media: MediaClient | None = None,
        auto_adopt: frozenset[str] = frozenset(),
    ) -> None:
        self._engine = engine
        self._auto_adopt = auto_adopt
        self._requests = ProviderRequests(providers)
        self._media = media
        self._providers = providers
        self._period = period_seconds
        self._clock = clock
        self._batch = batch
        self._stopping = asyncio.Event()
        self._log = Throttle()
        self.sweeps = 0  # completed sweeps, for tests and metrics

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.sweep()
            except Exception as error:
                outage = classify(error)
                if outage is None:
                    raise
                if self._log.admit(outage.kind) is not None:
                    log.warning("reap_failed", error=outage.kind)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._period)

    async def stop(self, deadline: float) -> None:
        self._stopping.set()

    async def sweep(self) -> list[Job]:
        """Resolves every expired lease now, a batch per transaction."""
        idempotent = [c for c, p in self._providers.items() if p.supports_idempotent_submit]
        reaped: list[Job] = []
        while True:
            batch = await leases.reap_decided(
                self._engine, self._clock(), self._batch, idempotent, self._tell_provider
            )
            # Counted once the batch committed: a rolled-back decision is no decision.
            # Each decision is a job event by ``reaper`` and counted; only the one an
            # operator must act on (NEEDS_ATTENTION) is an INFO line, the rest DEBUG.
            for item in batch:
                _DECIDED[item.decision].inc()
                line = log.info if item.decision is ReapDecision.ATTENTION else log.debug
                line(
                    "job_reaped",
                    job_id=item.job.job_id,
                    status=item.job.status.value,
                    decision=item.decision.value,
                )
            for item in batch:
                if item.decision is ReapDecision.ATTENTION:
                    reaped.append(await self._recover(item.job))
                else:
                    reaped.append(item.job)
            if len(batch) < self._batch or self._stopping.is_set():
                break
        if self._media is not None:
            # After the leases: a job this sweep cancelled has its outputs purged at once.
            await self._purge_outputs(self._media)
        self.sweeps += 1
        LAST_SWEEP.set_to_current_time()
        return reaped

    async def _recover(self, job: Job) -> Job:
        """The job adopted when automatic recovery is on for its provider and the lookup
        finds exactly one request; otherwise as it is (NEEDS_ATTENTION)."""
        if job.provider_code not in self._auto_adopt:
            return job
        request_id = await self._requests.sole_request(job)
        if request_id is None:
            return job
        try:
            adopted = await admin_store.adopt(
                self._engine,
                job.job_id,
                request_id,
                actor=Actor.REAPER,
                actor_id="reaper",
                reason=f"automatic recovery: provider {job.provider_code} holds exactly one"
                f" request for the job ({request_id})",
                now=self._clock(),
            )
        except (JobNotAwaitingOperator, JobCancelRequested):
            return job  # someone decided first, or the owner asked to cancel
        ADOPTIONS.inc()
        log.info("job_adopted", job_id=job.job_id, provider_request_id=request_id, by="reaper")
        return adopted

    async def _purge_outputs(self, media: MediaClient) -> None:
        try:
            await output_purger.sweep(self._engine, media, self._batch)
        except Exception as error:
            if classify(error) is not None:
                raise  # the database is away: run() logs it once
            # media away (or refusing): the list stays for the next sweep.
            if self._log.admit(f"purge:{type(error).__name__}") is not None:
                log.warning("outputs_purge_deferred", error=type(error).__name__)

    async def _tell_provider(self, job: Job) -> None:
        provider = self._providers.get(job.provider_code)
        if provider is None or job.provider_request_id is None:
            return
        try:
            await asyncio.wait_for(
                provider.cancel(job.provider_request_id), PROVIDER_CANCEL_TIMEOUT_SECONDS
            )
        except (ProviderError, TimeoutError) as error:
            # The job is cancelled for its owner either way; its output is never attached.
            log.warning("provider_cancel_failed", job_id=job.job_id, error=str(error))
