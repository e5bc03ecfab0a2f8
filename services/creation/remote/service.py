"""The remote worker protocol's service layer: who holds which lease (checked on the
server's clock), claims and their replays, and the keyed calls that change a job, each
answered once and replayed from its stored answer.

A lease is named by its claim token: the server looks the token's hash up and only then
the job, so a caller without the token cannot tell a job that exists from one that does
not. Refusals are checked in one order (token, pool, generation, expiry), each with its
own reason."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status, output_key, retry_delay
from services.creation.errors import IdempotencyKeyReused, InputAssetNotFound
from services.creation.media_client import (
    AssetRefused,
    AssetStream,
    AssetUnreadable,
    MediaClient,
    OutputUpload,
)
from services.creation.remote.errors import (
    CallReplayExpired,
    ClaimReplayExpired,
    ClaimTokenReused,
    LeaseRefused,
    OutputRejected,
    Reason,
    VersionMismatch,
)
from services.creation.remote.settings import RemoteSettings
from services.creation.store import leases, remote
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.remote import (
    CallTransaction,
    ClaimRequest,
    HeldLease,
    NewClaim,
    StoredCall,
)
from services.creation.worker import output_purger
from services.kit.clock import Clock
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.logging import get_logger

log = get_logger(__name__)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lease_owner(pool: str, worker_id: str) -> str:
    """The lease owner a remote worker's jobs carry, and so its audit events' actor."""
    return f"{pool}/{worker_id}"


@dataclass(frozen=True)
class LeaseClaim:
    """What a worker's call says it holds."""

    pool: str
    worker_id: str
    job_id: str
    claim_token: str
    lease_generation: int

    @property
    def token_hash(self) -> str:
        return digest(self.claim_token)


@dataclass(frozen=True)
class CallKey:
    """A keyed call: its idempotency key, its method and its request's SHA-256."""

    request_id: str
    method: str
    request_hash: str
    sent_at: datetime | None = None  # the request's request_time, when it says


def lease_problem(held: HeldLease | None, claim: LeaseClaim, now: datetime) -> str | None:
    """Why ``claim`` does not hold its lease now, or None."""
    if held is None or held.job.job_id != claim.job_id:
        return Reason.LEASE_TOKEN_INVALID
    if held.pool != claim.pool:
        return Reason.LEASE_POOL_MISMATCH
    if held.worker_id != claim.worker_id:
        return Reason.LEASE_TOKEN_INVALID
    if held.lease_generation != claim.lease_generation:
        return Reason.LEASE_GENERATION_STALE
    job = held.job
    if (
        job.status is not Status.RUNNING
        or job.lease_epoch != claim.lease_generation
        or job.lease_expires_at is None
        or job.lease_expires_at <= now
    ):
        return Reason.LEASE_EXPIRED
    return None


def _holding(held: HeldLease | None, claim: LeaseClaim, now: datetime) -> Job:
    problem = lease_problem(held, claim, now)
    if problem is not None:
        raise LeaseRefused(problem)
    assert held is not None
    return held.job


@dataclass(frozen=True)
class OutputSpec:
    """An output as the worker declares it before uploading it."""

    content_type: str
    size_bytes: int
    sha256: str


Respond = Callable[[Sequence[OutputUpload]], bytes]


def _replayed(stored: StoredCall, key: CallKey) -> bytes:
    """A keyed call's stored answer, if ``key`` repeats its request."""
    if (stored.method, stored.request_hash) != (key.method, key.request_hash):
        raise IdempotencyKeyReused()
    return stored.response


def _require_all_outputs(job: Job, count: int, field: str) -> None:
    if count != job.num_outputs:
        raise invalid_argument(
            Reason.INVALID_WORKER_REQUEST,
            [FieldViolation(field, f"the job makes exactly {job.num_outputs} images")],
        )


@dataclass(frozen=True)
class Failure:
    code: str
    message: str
    retryable: bool
    outcome_unknown: bool
    retry_after_seconds: float | None


class RemoteJobs:
    def __init__(
        self,
        engine: AsyncEngine,
        media: MediaClient,
        settings: RemoteSettings,
        clock: Clock,
        *,
        backoff_base_seconds: float,
        backoff_max_seconds: float,
    ) -> None:
        self._engine = engine
        self._media = media
        self._settings = settings
        self._clock = clock
        self._backoff = (backoff_base_seconds, backoff_max_seconds)

    def _past_retention(self, sent_at: datetime | None, now: datetime) -> bool:
        """A request first sent longer ago than claims and answers are kept: what it
        would replay may be pruned, so it is refused whether or not it still is."""
        retention = timedelta(seconds=self._settings.retention_seconds)
        return sent_at is not None and sent_at < now - retention

    def heartbeat_seconds(self, job: Job) -> float:
        """The heartbeat interval for a claimed job's lease."""
        if job.lease_expires_at is None:
            return self._settings.heartbeat_seconds
        lease = (job.lease_expires_at - job.updated_at).total_seconds()
        return self._settings.heartbeat_for(lease)

    # --- claims -----------------------------------------------------------------------

    async def claim(
        self,
        pool: str,
        request_id: str,
        claim_token: str,
        worker_id: str,
        lease_seconds: float,
        sent_at: datetime | None = None,
    ) -> Job | None:
        """The job claimed (None: nothing due), or the same answer for a replay.
        ``lease_seconds`` is the worker's ask (0: the default); ``sent_at`` when the
        worker first sent the claim, if it says."""
        now = self._clock()
        if self._past_retention(sent_at, now):
            raise ClaimReplayExpired()
        token_hash = digest(claim_token)
        owner = lease_owner(pool, worker_id)
        request = ClaimRequest(
            pool,
            request_id,
            digest(f"{token_hash}:{worker_id}:{lease_seconds!r}"),
            token_hash,
            worker_id,
            owner,
            timedelta(seconds=self._settings.granted(lease_seconds)),
        )
        try:
            result = await remote.claim(self._engine, request, now)
        except remote.TokenReused:
            raise ClaimTokenReused() from None
        if isinstance(result, NewClaim):
            if result.job is not None:
                log.info("remote_job_claimed", job_id=result.job.job_id, owner=owner)
            return result.job
        record = result.record
        if record.request_hash != request.request_hash:
            raise IdempotencyKeyReused()
        if record.job_id is None:
            return None  # an empty claim stays empty, whatever arrived since
        job = result.job
        if (
            job is None
            or job.status is not Status.RUNNING
            or job.lease_epoch != record.lease_generation
            or job.lease_owner != owner
            or job.lease_expires_at is None
            or job.lease_expires_at <= now
        ):
            raise ClaimReplayExpired()
        log.info("remote_claim_replayed", job_id=job.job_id, owner=owner)
        return job

    # --- calls that change nothing but the lease ----------------------------------------

    async def heartbeat(self, claim: LeaseClaim, progress: int | None) -> tuple[Job, datetime]:
        """The job after the beat, and the server's time of it."""
        now = self._clock()
        held = await remote.read_lease(self._engine, claim.token_hash, claim.job_id)
        _holding(held, claim, now)
        assert held is not None
        job = await leases.heartbeat(
            self._engine, claim.job_id, claim.lease_generation, held.lease, now, progress
        )
        if job is None:
            raise LeaseRefused(Reason.LEASE_EXPIRED)
        return job, now

    async def read_input(self, claim: LeaseClaim) -> AssetStream:
        """The input's bytes from media, for the current claim only: checked when the
        worker asks, so nothing outlives the lease (there is no URL to pass on)."""
        job = await self._held(claim)
        if job.input_asset_id is None:
            raise InputAssetNotFound()  # made from the prompt alone: nothing to read
        try:
            return await self._media.open_asset(job.input_asset_id)
        except AssetUnreadable:
            raise InputAssetNotFound() from None

    async def _held(self, claim: LeaseClaim) -> Job:
        """The job ``claim`` holds now (read without a lock), or its refusal."""
        held = await remote.read_lease(self._engine, claim.token_hash, claim.job_id)
        return _holding(held, claim, self._clock())

    # --- keyed calls ------------------------------------------------------------------

    async def start(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        request_id: str | None,
        respond: Callable[[Job], bytes],
        provider_version: str | None = None,
    ) -> bytes:
        """SUBMITTING (no provider request id yet; with the adapter's version, recorded
        with the job) or GENERATING (with one)."""

        async def act(tx: CallTransaction, job: Job) -> Job | None:
            if request_id is None:
                return await tx.fenced(
                    FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, provider_version
                )
            return await tx.fenced(
                FencedWrite.RECORD_REQUEST, job.job_id, job.lease_epoch, request_id
            )

        return await self._keyed(claim, key, expected_version, act, respond)

    async def prepare_outputs(
        self, claim: LeaseClaim, key: CallKey, specs: Sequence[OutputSpec], respond: Respond
    ) -> bytes:
        """One media upload per output, reserved under the output's key (job, attempt,
        index): a replay, or another call for the same attempt's outputs, answers the same
        assets. The answer is stored under the call's key like any keyed call's."""
        stored = await self._stored(claim.pool, key)
        if stored is not None:
            return stored
        job = await self._held(claim)
        _require_all_outputs(job, len(specs), "outputs")
        uploads = []
        for index, spec in enumerate(specs):
            try:
                uploads.append(
                    await self._media.reserve_output(
                        job.user_id,
                        spec.content_type,
                        spec.size_bytes,
                        spec.sha256,
                        output_key(job.job_id, job.attempt, index),
                    )
                )
            except AssetRefused as error:
                raise OutputRejected(str(error)) from None
        response = respond(uploads)
        try:
            async with remote.call_transaction(self._engine, self._clock()) as tx:
                held = await tx.lock_lease(claim.token_hash, claim.job_id)
                twin = await tx.find_call(claim.pool, key.request_id)
                if twin is not None:
                    return _replayed(twin, key)
                _holding(held, claim, self._clock())
                await tx.record(
                    claim.pool, key.request_id, key.method, key.request_hash, job.job_id, response
                )
        except remote.CallKeyTaken:
            raise IdempotencyKeyReused() from None
        return response

    async def complete(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        output_asset_ids: Sequence[str],
        respond: Callable[[Job], bytes],
    ) -> bytes:
        """Completes each uploaded output through media (which checks it against what
        PrepareOutputs declared, and answers a completed one as it is, so a retry after a
        crash finishes the work), then completes the job; a cancel asked meanwhile
        cancels it instead and the outputs are deleted. An output media refuses (not the
        declared bytes, not this attempt's asset) leaves the job running."""
        stored = await self._stored(claim.pool, key)
        if stored is not None:
            return stored
        job = await self._held(claim)
        if job.version != expected_version:
            raise VersionMismatch(job.version)
        _require_all_outputs(job, len(output_asset_ids), "output_asset_ids")
        landed = []
        for index, asset_id in enumerate(output_asset_ids):
            try:
                landed.append(
                    await self._media.complete_output(
                        job.user_id, asset_id, output_key(job.job_id, job.attempt, index)
                    )
                )
            except AssetRefused as error:
                log.info("remote_output_rejected", job_id=job.job_id, index=index, error=str(error))
                raise OutputRejected(str(error)) from None

        async def act(tx: CallTransaction, job: Job) -> Job | None:
            if job.cancel_requested:
                return await tx.fenced(FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch)
            return await tx.fenced(
                FencedWrite.COMPLETE, job.job_id, job.lease_epoch, outputs_value(landed)
            )

        return await self._keyed(claim, key, expected_version, act, respond, purge=True)

    async def fail(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        failure: Failure,
        respond: Callable[[Job], bytes],
    ) -> bytes:
        async def act(tx: CallTransaction, job: Job) -> Job | None:
            if failure.outcome_unknown:
                return await tx.fenced(
                    FencedWrite.OUTCOME_UNKNOWN,
                    job.job_id,
                    job.lease_epoch,
                    f"the provider's answer to the submit was lost ({failure.code})",
                )
            delay = retry_delay(job.attempt, *self._backoff, failure.retry_after_seconds)
            return await leases.fail_on(
                tx.connection,
                job.job_id,
                job.lease_epoch,
                failure.code,
                failure.message,
                retryable=failure.retryable,
                retry_delay=delay,
                now=tx.now,
            )

        return await self._keyed(claim, key, expected_version, act, respond, purge=True)

    async def release(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        delay: timedelta,
        respond: Callable[[Job], bytes],
    ) -> bytes:
        """Queues the job again with what it has; one whose owner asked to cancel is
        cancelled instead (the worker stopped anyway)."""

        async def act(tx: CallTransaction, job: Job) -> Job | None:
            if job.cancel_requested:
                return await tx.fenced(FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch)
            return await leases.hand_back_on(
                tx.connection, job.job_id, job.lease_epoch, delay, tx.now
            )

        return await self._keyed(claim, key, expected_version, act, respond, purge=True)

    async def acknowledge_cancel(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        respond: Callable[[Job], bytes],
    ) -> bytes:
        async def act(tx: CallTransaction, job: Job) -> Job | None:
            return await tx.fenced(FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch)

        return await self._keyed(claim, key, expected_version, act, respond, purge=True)

    async def _stored(self, pool: str, key: CallKey) -> bytes | None:
        if self._past_retention(key.sent_at, self._clock()):
            raise CallReplayExpired()
        stored = await remote.find_call(self._engine, pool, key.request_id)
        return None if stored is None else _replayed(stored, key)

    async def _keyed(
        self,
        claim: LeaseClaim,
        key: CallKey,
        expected_version: int,
        act: Callable[[CallTransaction, Job], Awaitable[Job | None]],
        respond: Callable[[Job], bytes],
        *,
        purge: bool = False,
    ) -> bytes:
        """One keyed call in one transaction: the lease locked, a stored answer replayed
        (checked after the lock, so a concurrent twin's answer is seen), the lease and the
        version checked, the write, its answer stored."""
        now = self._clock()
        if self._past_retention(key.sent_at, now):
            raise CallReplayExpired()
        try:
            async with remote.call_transaction(self._engine, now) as tx:
                held = await tx.lock_lease(claim.token_hash, claim.job_id)
                stored = await tx.find_call(claim.pool, key.request_id)
                if stored is not None:
                    return _replayed(stored, key)
                job = _holding(held, claim, now)
                if job.version != expected_version:
                    raise VersionMismatch(job.version)
                written = await act(tx, job)
                if written is None:
                    # The row is locked and held: only a bug gets here.
                    raise LeaseRefused(Reason.LEASE_EXPIRED)
                response = respond(written)
                await tx.record(
                    claim.pool, key.request_id, key.method, key.request_hash, job.job_id, response
                )
        except remote.ProviderRequestTaken:
            raise invalid_argument(
                Reason.INVALID_WORKER_REQUEST,
                [FieldViolation("provider_request_id", "another job holds this request")],
            ) from None
        except remote.CallKeyTaken:
            # The same key on another job at the same moment: it is that call's now.
            raise IdempotencyKeyReused() from None
        log.info(
            "remote_job_written",
            job_id=written.job_id,
            method=key.method,
            status=written.status.value,
            version=written.version,
            owner=lease_owner(claim.pool, claim.worker_id),
        )
        if (
            purge
            and written.status is not Status.SUCCEEDED
            and written.status is not Status.RUNNING
        ):
            await self._purge(written.job_id)
        return response

    async def _purge(self, job_id: str) -> None:
        """Deletes what the attempt landed now that it ended without success; a failure
        leaves it listed for the reaper's sweep."""
        try:
            await asyncio.shield(output_purger.purge(self._engine, self._media, job_id=job_id))
        except Exception as error:
            log.warning("outputs_purge_deferred", job_id=job_id, error=type(error).__name__)
