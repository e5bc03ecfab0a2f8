"""What creation does with a user's jobs, whoever asks: submit (with the input-asset
rules), read, list, cancel, delete, and the user's balance. The servicer translates protobuf; the
store runs SQL; the rules that need both the store and media live here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.errors import InputAssetNotFound, InputAssetNotReady, InvalidRequest, Reason
from services.creation.list_filter import JobFilter
from services.creation.media_client import MediaClient, OutputUrls
from services.creation.queue_standing import QueueStanding, Standing
from services.creation.ready_inputs import ReadyInputs
from services.creation.store import deletions, ledger, ledger_entries
from services.creation.store import jobs as job_store
from services.creation.store.jobs import Cursor, SubmitLimits
from services.creation.submission import SubmitCommand
from services.creation.waits import SETTLED, JobWaits
from services.kit import deadlines
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger
from services.kit.tracing import current_traceparent

log = get_logger(__name__)
# A job's creation is its first job_events row (actor, via, time); the log line beside it
# is DEBUG (a line per job was a tenth of an engine process's CPU) and this counts them.
SUBMITTED = Counter(
    "atelier_jobs_submitted",
    "Jobs SubmitJob created (a replayed submit, which creates none, is not counted)",
)

# A wait without the LISTEN component (tools, tests) reads the job this often.
RECHECK_SECONDS = 2.0


@dataclass(frozen=True)
class JobView:
    """A job as its owner sees it: fresh download links of its outputs, by asset id
    (absent where media could not give one)."""

    job: Job
    urls: Mapping[str, OutputUrls] = field(default_factory=dict)
    # A queued job's place in the queue (by job id; absent otherwise).
    standings: Mapping[str, Standing] = field(default_factory=dict)


class Jobs:
    def __init__(
        self,
        engine: AsyncEngine,
        media: MediaClient,
        limits: SubmitLimits,
        clock: Clock = system_clock,
        ready_inputs: ReadyInputs | None = None,
        waits: JobWaits | None = None,
    ) -> None:
        self._engine = engine
        # None: waits are made by re-reading the job every RECHECK_SECONDS (no LISTEN).
        self._waits = waits
        # Shared with QueueStandingService (app.py): one claim-rate read per process.
        self.queue_standing = QueueStanding(engine)
        self._media = media
        self._limits = limits
        self._clock = clock
        # None: media is asked on every submit.
        self._ready_inputs = (
            ReadyInputs(ttl_seconds=0, max_entries=0) if ready_inputs is None else ready_inputs
        )

    async def submit(self, user_id: str, command: SubmitCommand, via: str = "") -> Job:
        """A new job, or the one an earlier submit with the same key made (a replay asks
        media nothing: the input was checked when the job was made). ``via``: the service
        identity that submits for the user, if one does."""
        # With the input vouched for (or none), there is nothing to ask media, so no
        # replay to look for first: the submit's one call answers a replay itself.
        asks_media = command.input_url is not None or (
            command.input_asset_id is not None
            and not self._ready_inputs.vouched(user_id, command.input_asset_id)
        )
        submitted = (
            await job_store.find_replay(self._engine, user_id, command) if asks_media else None
        )
        if submitted is None:
            if command.input_url is not None:
                command = replace(command, input_asset_id=await self.import_input(user_id, command))
            elif asks_media and command.input_asset_id is not None:
                await self.check_input_asset(user_id, command.input_asset_id)
            submitted = await job_store.submit(
                self._engine,
                user_id,
                command,
                self._limits,
                self._clock(),
                # The job's life (attempts, deliveries) joins this submit's trace.
                trace_parent=current_traceparent(),
                via=via,
            )
        job = submitted.job
        if submitted.replayed:
            log.info("job_submit_replayed", job_id=job.job_id, user_id=user_id)
        else:
            SUBMITTED.inc()
            log.debug(
                "job_submitted",
                job_id=job.job_id,
                user_id=user_id,
                model_id=job.model_id,
                style_id=job.style_id,
                price_points=job.price_points,
                **_acting(via),
            )
        return job

    async def import_input(self, user_id: str, command: SubmitCommand) -> str:
        """The input media imported from the request's input_url, owned by the caller. A
        keyed submit imports under a key made of its own key and the URL, so a repeat
        (after a crash, or a refusal further on) reuses the photo instead of fetching
        again, and the same key with another URL imports anew (the submit then answers
        IDEMPOTENCY_KEY_REUSED, as any other change of the request)."""
        assert command.input_url is not None
        key = ""
        if command.idempotency_key is not None:
            digest = hashlib.sha256(f"{command.idempotency_key}\n{command.input_url}".encode())
            key = f"creation:input-url:{digest.hexdigest()}"
        # The fetch is bounded by media (its guard's time limit), not by this call's
        # deadline, which covers the work of creation itself.
        with deadlines.paused():
            asset_id = await self._media.import_asset(user_id, command.input_url, key)
        log.info("input_imported", user_id=user_id, asset_id=asset_id)
        return asset_id

    async def check_input_asset(self, user_id: str, asset_id: str) -> None:
        """The input must be the caller's own, uploaded as an input photo, and complete.
        Unknown, someone else's and deleted all look the same. An input media vouched
        for recently is not asked about again (see ready_inputs)."""
        if self._ready_inputs.vouched(user_id, asset_id):
            return
        info = await self._media.asset_info(asset_id)
        if info is None or info.owner_user_id != user_id or info.status == "deleted":
            raise InputAssetNotFound()
        if info.purpose != "ai_input":
            raise InvalidRequest(
                Reason.INPUT_ASSET_WRONG_PURPOSE, "input_asset_id", "is not an uploaded input photo"
            )
        if info.status != "ready":
            raise InputAssetNotReady()
        self._ready_inputs.remember(user_id, asset_id)

    async def get(self, user_id: str, job_id: str) -> JobView:
        job = await job_store.get(self._engine, user_id, job_id)
        return await self.view(job)

    async def view(self, job: Job) -> JobView:
        """``job`` with its outputs' URLs, or its standing in the queue when queued."""
        return JobView(job, await self.output_urls([job]), await self.standings([job]))

    async def standings(self, jobs: Sequence[Job]) -> Mapping[str, Standing]:
        """Where the queued ones among ``jobs`` stand (queue_standing)."""
        return await self.queue_standing.of(jobs, self._clock())

    async def wait(
        self, user_id: str, job_id: str, seconds: float, answer_by: float | None = None
    ) -> JobView:
        """The job once it has settled (terminal or NEEDS_ATTENTION), or as it is after
        ``seconds``; the rest of the call ends by ``answer_by`` (the loop's clock: the
        client's deadline, see kit.deadlines.answer_by), and so must the wait."""
        job = await self._wait_for(user_id, job_id, seconds, answer_by)
        return await self.view(job)

    async def _wait_for(
        self, user_id: str, job_id: str, seconds: float, answer_by: float | None
    ) -> Job:
        if self._waits is None:
            return await self._wait_by_reading(user_id, job_id, seconds, answer_by)
        # Watched before the first read: a change committed after it wakes the event.
        with self._waits.watching(job_id) as settled:
            job = await job_store.get(self._engine, user_id, job_id)  # NOT_FOUND first
            if job.status in SETTLED or seconds <= 0:
                return job
            with deadlines.paused(answer_by), contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), seconds)
        return await job_store.get(self._engine, user_id, job_id)

    async def _wait_by_reading(
        self, user_id: str, job_id: str, seconds: float, answer_by: float | None
    ) -> Job:
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        job = await job_store.get(self._engine, user_id, job_id)
        while job.status not in SETTLED and loop.time() < until:
            with deadlines.paused(answer_by):
                await asyncio.sleep(min(RECHECK_SECONDS, until - loop.time()))
            job = await job_store.get(self._engine, user_id, job_id)
        return job

    async def output_urls(self, jobs: Sequence[Job]) -> Mapping[str, OutputUrls]:
        """Fresh URLs (picture and thumbnail) of the succeeded jobs' outputs, by asset id,
        from one call to media for a whole page; empty where media could not sign."""
        asset_ids = [a for job in jobs if job.status is Status.SUCCEEDED for a in job.outputs]
        if not asset_ids:
            return {}
        return await self._media.output_urls(asset_ids)

    async def list_page(
        self, user_id: str, chosen: JobFilter, limit: int, after: Cursor | None
    ) -> tuple[list[Job], Cursor | None]:
        return await job_store.list_for_user(self._engine, user_id, chosen, limit, after)

    async def cancel(self, user_id: str, job_id: str, via: str = "") -> Job:
        cancelled = await job_store.cancel(self._engine, user_id, job_id, self._clock(), via)
        job = cancelled.job
        if not cancelled.changed:
            return job  # asked before: nothing new to say
        if job.status is Status.CANCELLED:
            log.info(
                "job_cancelled",
                job_id=job.job_id,
                user_id=user_id,
                version=job.version,
                **_acting(via),
            )
        else:
            # Running or awaiting an operator: whoever holds it finishes the cancel.
            log.info(
                "job_cancel_requested",
                job_id=job.job_id,
                user_id=user_id,
                status=job.status.value,
                version=job.version,
                **_acting(via),
            )
        return job

    async def delete(self, user_id: str, job_id: str, delete_assets: bool, via: str = "") -> None:
        """Deletes a finished job; with ``delete_assets`` its images first, so that media
        being down leaves the job as it was (a retry deletes what is left, then the job).
        Deleting a deleted job again is done already (its remaining assets are deleted
        when asked)."""
        job = await deletions.deletable(self._engine, user_id, job_id)
        if delete_assets:
            await self._delete_assets(job)
        if job.deleted_at is not None:
            return
        deleted = await deletions.mark_deleted(self._engine, user_id, job_id, self._clock(), via)
        log.info(
            "job_deleted",
            job_id=job_id,
            user_id=user_id,
            version=deleted.version,
            assets_deleted=delete_assets,
        )

    async def _delete_assets(self, job: Job) -> None:
        """The outputs, and the input unless another shown job of the owner uses it.
        Deleting a deleted asset succeeds, so a retry repeats this safely."""
        targets = list(job.outputs)
        if job.input_asset_id is not None and not await deletions.input_in_use(self._engine, job):
            targets.append(job.input_asset_id)
            self._ready_inputs.forget(job.input_asset_id)
        await asyncio.gather(*(self._media.delete_asset(asset_id) for asset_id in targets))

    async def ledger_page(
        self, user_id: str, limit: int, after: ledger_entries.EntryCursor | None
    ) -> tuple[list[ledger_entries.LedgerEntry], ledger_entries.EntryCursor | None]:
        return await ledger_entries.list_for_user(self._engine, user_id, limit, after)

    @property
    def limits(self) -> SubmitLimits:
        return self._limits

    def now(self) -> datetime:
        return self._clock()

    async def balance(self, user_id: str, now: datetime | None = None) -> ledger.Balance:
        """The balance and what the quotas count, as of ``now`` (default: the clock's)."""
        return await ledger.read_balance(
            self._engine, user_id, self._limits.welcome_points, now or self._clock()
        )


def _acting(via: str) -> dict[str, str]:
    """A log line's field naming the backend that acted for the user, if one did."""
    return {"via": via} if via else {}
