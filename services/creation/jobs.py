"""What creation does with a user's jobs, whoever asks: submit (with the input-asset
rules), read, list, cancel, delete, and the user's balance. The servicer translates protobuf; the
store runs SQL; the rules that need both the store and media live here."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.errors import InputAssetNotFound, InputAssetNotReady, InvalidRequest, Reason
from services.creation.list_filter import JobFilter
from services.creation.media_client import MediaClient, OutputUrls
from services.creation.ready_inputs import ReadyInputs
from services.creation.store import deletions, ledger, ledger_entries
from services.creation.store import jobs as job_store
from services.creation.store.jobs import Cursor, SubmitLimits
from services.creation.submission import SubmitCommand
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger
from services.kit.tracing import current_traceparent

log = get_logger(__name__)


@dataclass(frozen=True)
class JobView:
    """A job as its owner sees it: fresh download links of its outputs, by asset id
    (absent where media could not give one)."""

    job: Job
    urls: Mapping[str, OutputUrls] = field(default_factory=dict)


class Jobs:
    def __init__(
        self,
        engine: AsyncEngine,
        media: MediaClient,
        limits: SubmitLimits,
        clock: Clock = system_clock,
        ready_inputs: ReadyInputs | None = None,
    ) -> None:
        self._engine = engine
        self._media = media
        self._limits = limits
        self._clock = clock
        # None: media is asked on every submit.
        self._ready_inputs = (
            ReadyInputs(ttl_seconds=0, max_entries=0) if ready_inputs is None else ready_inputs
        )

    async def submit(self, user_id: str, command: SubmitCommand) -> Job:
        """A new job, or the one an earlier submit with the same key made (a replay asks
        media nothing: the input was checked when the job was made)."""
        # With the input vouched for, there is nothing to ask media, so no replay to look
        # for first: the submit's one call answers a replay itself.
        vouched = self._ready_inputs.vouched(user_id, command.input_asset_id)
        submitted = None if vouched else await job_store.find_replay(self._engine, user_id, command)
        if submitted is None:
            if not vouched:
                await self.check_input_asset(user_id, command.input_asset_id)
            submitted = await job_store.submit(
                self._engine,
                user_id,
                command,
                self._limits,
                self._clock(),
                # The job's life (attempts, deliveries) joins this submit's trace.
                trace_parent=current_traceparent(),
            )
        job = submitted.job
        if submitted.replayed:
            log.info("job_submit_replayed", job_id=job.job_id, user_id=user_id)
        else:
            log.info(
                "job_submitted",
                job_id=job.job_id,
                user_id=user_id,
                model_id=job.model_id,
                style_id=job.style_id,
                price_points=job.price_points,
            )
        return job

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
        return JobView(job, await self.output_urls([job]))

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

    async def cancel(self, user_id: str, job_id: str) -> Job:
        cancelled = await job_store.cancel(self._engine, user_id, job_id, self._clock())
        job = cancelled.job
        if not cancelled.changed:
            return job  # asked before: nothing new to say
        if job.status is Status.CANCELLED:
            log.info("job_cancelled", job_id=job.job_id, user_id=user_id, version=job.version)
        else:
            # Running or awaiting an operator: whoever holds it finishes the cancel.
            log.info(
                "job_cancel_requested",
                job_id=job.job_id,
                user_id=user_id,
                status=job.status.value,
                version=job.version,
            )
        return job

    async def delete(self, user_id: str, job_id: str, delete_assets: bool) -> None:
        """Deletes a finished job; with ``delete_assets`` its images first, so that media
        being down leaves the job as it was (a retry deletes what is left, then the job).
        Deleting a deleted job again is done already (its remaining assets are deleted
        when asked)."""
        job = await deletions.deletable(self._engine, user_id, job_id)
        if delete_assets:
            await self._delete_assets(job)
        if job.deleted_at is not None:
            return
        deleted = await deletions.mark_deleted(self._engine, user_id, job_id, self._clock())
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
        if not await deletions.input_in_use(self._engine, job):
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
