"""The in-process worker's attempt at one job: the attempt driver (``driver.py``, where
the attempt's policy lives) over :class:`FencedPort`, its fenced-store adapter, with the
attempt's span, log line and recorded outcome around it.

Every write is fenced by the lease; one that matches nothing ends the attempt without
another write. Writes go through the process's FencedWriter, so the attempts of a claimed
batch share one statement per kind. A write the database could not take (down, frozen, a
lock wait given up) is sent again for as long as the lease may still hold (the lease
keeper says when it cannot): a short outage must not cost the job its attempt, nor a
submitted job its request id (without it the job would wait for an operator).

Outputs are landed under idempotency keys of the job, the attempt and the output's index
(``domain.output_key``): a worker killed after landing leaves assets that the worker
resuming the attempt lands onto again, and an attempt that ends without success has
what it may have landed deleted by key (see ``output_purger``). So nothing landed is
orphaned, whichever point a worker dies at.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeVar

from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode
from prometheus_client import Counter

from services.creation.domain import Job, Status, output_key, retry_delay
from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, AssetUnreadable
from services.creation.parameters import from_stored
from services.creation.providers.base import InputImage, OutputImage, ProviderError
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite, Written, outputs_value
from services.creation.worker import output_purger
from services.creation.worker.context import AttemptContext
from services.creation.worker.driver import (
    AttemptDriver,
    AttemptJob,
    HandedBack,
    PollPolicy,
)
from services.creation.worker.lease_keeper import Lease
from services.creation.worker.outcomes import AttemptFailed, LeaseLost
from services.kit import tracing
from services.kit.logging import get_logger
from services.kit.outages import Throttle, classify, log_unavailable

log = get_logger(__name__)
# One line per outage kind per window, however many attempts it stops.
_OUTAGE_LOG = Throttle()
WRITES_RETRIED = Counter(
    "atelier_worker_writes_retried",
    "Fenced writes of an attempt sent again because PostgreSQL was unavailable or a lock "
    "wait gave way; the attempt waits while its lease may still hold",
)
# How in-process attempts end (the value ``Attempt.run`` answers).
OUTCOMES = (
    "succeeded",
    "retrying",
    "failed",
    "cancelled",
    "handed_back",
    "outcome_unknown",
    "lease_lost",
    "crashed",
    "database_unavailable",
)
ATTEMPTS = Counter(
    "atelier_worker_attempts",
    "Attempts this process's worker ended, by outcome: succeeded, retrying (failed, queued "
    "again), failed (for good), cancelled, handed_back, outcome_unknown (NEEDS_ATTENTION), "
    "lease_lost, crashed (a bug), database_unavailable",
    ["outcome"],
)
_ENDED = {outcome: ATTEMPTS.labels(outcome) for outcome in OUTCOMES}
# How long an attempt waits before sending a write again, doubling up to the longest.
FIRST_WRITE_PAUSE_SECONDS = 0.25
LONGEST_WRITE_PAUSE_SECONDS = 2.0
# What a fenced write answers: the whole job, or (batched writes) its status and version.
W = TypeVar("W", Job, Written)

# Attempt endings that are failures of ours, not of the job (an error in its span).
_BROKEN = frozenset({"crashed", "database_unavailable"})


class Attempt:
    def __init__(self, job: Job, lease: Lease, context: AttemptContext) -> None:
        self._job = job
        self._lease = lease
        self._context = context

    async def run(self) -> str:
        """Runs the attempt; returns how it ended (the log's action for it). While tracing
        is on the attempt is a span in its job's trace (a child of the submit), and its
        calls to media are spans under it."""
        job = self._job
        attributes = {
            "atelier.job_id": job.job_id,
            "atelier.attempt": job.attempt,
            "atelier.lease_epoch": job.lease_epoch,
        }
        with tracing.span_in_trace("job attempt", job.trace_parent, attributes=attributes) as span:
            outcome = await self._run_and_log()
            if span is not None:
                span.set_attribute("atelier.attempt_outcome", outcome)
                if outcome in _BROKEN:
                    span.set_status(SpanStatus(StatusCode.ERROR, outcome))
        return outcome

    async def _run_and_log(self) -> str:
        job = self._job
        try:
            outcome = await self._driver().run()
        except Exception as error:
            # The database gone mid-write, or a bug: stop beating, so the lease expires and
            # the reaper decides by step. An outage is one short line, a bug its trace.
            outage = classify(error)
            if outage is None:
                log.exception("attempt_crashed", job_id=job.job_id, attempt=job.attempt)
            else:
                log_unavailable(_OUTAGE_LOG, outage.dependency, outage.kind, job_id=job.job_id)
            outcome = "crashed" if outage is None else "database_unavailable"
        # Counted, and logged at DEBUG only: the job's events and row keep each attempt's
        # story (its claim, lease epoch, end and error), and a line per attempt cost about
        # a tenth of an engine process's CPU. Crashes and outages still log above.
        ended = _ENDED.get(outcome)
        (ended if ended is not None else ATTEMPTS.labels(outcome)).inc()
        log.debug(
            "attempt_ended",
            job_id=job.job_id,
            attempt=job.attempt,
            lease_epoch=job.lease_epoch,
            outcome=outcome,
        )
        self._context.outcomes.record(job.job_id, outcome)
        return outcome

    def _driver(self) -> AttemptDriver:
        job, context = self._job, self._context
        settings = context.settings
        return AttemptDriver(
            attempt_job(job),
            FencedPort(job, self._lease, context),
            context.providers.get(job.provider_code),
            drain=context.drain,
            policy=PollPolicy(
                settings.worker.provider_poll_seconds,
                settings.backoff_base_seconds,
                settings.backoff_max_seconds,
            ),
            limits=context.limits,
            on_point=context.on_point,
        )


def attempt_job(job: Job) -> AttemptJob:
    parameters = from_stored(job.parameters)
    return AttemptJob(
        job,
        f"{job.job_id}:{job.attempt}",
        parameters,
        job.provider_request_id,
        has_input=job.input_asset_id is not None,
    )


class FencedPort:
    """The driver's port in the worker process: each step one fenced write through the
    process's FencedWriter (or, for fail and hand back, its own statement), sent again
    while the database cannot take it; media for the input and the outputs; what an
    attempt that ends without success landed, purged."""

    def __init__(self, job: Job, lease: Lease, context: AttemptContext) -> None:
        self._job = job
        self._lease = lease
        self._context = context
        self._settings = context.settings
        # Whether this attempt has a provider request: only then may it have landed
        # outputs that its end must purge.
        self._requested = job.provider_request_id is not None

    @property
    def cancel_requested(self) -> asyncio.Event:
        return self._lease.cancel_requested

    async def read_input(self) -> InputImage:
        """The input's bytes from its signed download URL (the object store, or media's
        object listener): media signs it, the bytes never cross its gRPC listener."""
        job = self._job
        if job.input_asset_id is None:
            raise AttemptFailed("INPUT_UNREADABLE", "the job has no input", retryable=False)
        media, transfer = self._context.media, self._context.transfer
        what = f"input asset {job.input_asset_id}"
        try:
            signed = await media.readable_url(job.input_asset_id)
            data, content_type = await transfer.download(
                signed.url, self._settings.worker.max_input_bytes, what
            )
        except AssetUnreadable as error:
            raise AttemptFailed("INPUT_UNREADABLE", str(error), retryable=False) from None
        except MediaUnavailable:
            raise AttemptFailed(
                "MEDIA_UNAVAILABLE", "media did not hand over the input", retryable=True
            ) from None
        return InputImage(data, content_type)

    async def input_url(self) -> str | None:
        if self._settings.providers.input_mode != "url" or self._job.input_asset_id is None:
            return None
        # A signed URL the provider fetches itself; media unable to give one leaves the
        # bytes inline (logged by the client).
        signed = await self._context.media.download_url(self._job.input_asset_id)
        return signed.url if signed is not None else None

    async def mark_submitting(self, provider_version: str) -> None:
        await self._write(lambda: self._fenced(FencedWrite.MARK_SUBMITTING, provider_version))

    async def record_request(self, request_id: str) -> None:
        job = self._job
        self._requested = True
        recorded: Written | None = None
        try:
            # Without this id the job would wait for an operator: it is worth sending past
            # the lease, for as long again, as long as nobody else took the job (its fence).
            recorded = await self._until_taken(
                lambda: self._fenced(FencedWrite.RECORD_REQUEST, request_id),
                past_the_lease=self._settings.lease_ttl_seconds,
            )
        finally:
            if recorded is None:
                # The job will wait for an operator, who needs this id to ask the provider.
                log.warning(
                    "request_id_unrecorded",
                    job_id=job.job_id,
                    attempt=job.attempt,
                    provider=job.provider_code,
                    request_id=request_id,
                )
        if recorded is None:
            raise LeaseLost()  # refused by the fence: the job is somebody else's
        if self._lease.lost:
            # Recorded, but the lease is gone (most often given up while the database did
            # not answer): the reaper resumes the job from this id, no operator needed.
            log.info("request_id_recorded_without_the_lease", job_id=job.job_id)
            raise LeaseLost()

    def report_progress(self, percent: int) -> None:
        self._lease.report(percent)  # the lease keeper's next beat writes it

    async def land_outputs(self, outputs: Sequence[OutputImage]) -> list[str] | None:
        """Each output reserved with media (its size, type and hash declared), PUT to the
        signed URL media answers, then committed (media checks the stored object and
        makes it READY for the job's user), one after another, each under its key."""
        landed: list[str] = []
        for index, output in enumerate(outputs):
            try:
                landed.append(await self._land(index, output))
            except AssetRefused as error:
                raise AttemptFailed("OUTPUT_REJECTED", str(error), retryable=True) from None
            except MediaUnavailable:
                return None
            self._context.on_point("after_output")
        return landed

    async def _land(self, index: int, output: OutputImage) -> str:
        job, media = self._job, self._context.media
        key = output_key(job.job_id, job.attempt, index)
        upload = await media.reserve_output(
            job.user_id,
            output.content_type,
            len(output.data),
            hashlib.sha256(output.data).hexdigest(),
            key,
        )
        if upload.url:  # none: a resumed attempt found this output committed already
            await self._context.transfer.upload(upload, output.data)
            # Uploaded, not committed: a worker killed here leaves an uploading asset,
            # which the attempt's resumption commits, its end purges, or, failing both,
            # media's housekeeping removes once the reservation expires.
            self._context.on_point("after_upload")
        return await media.complete_output(job.user_id, upload.asset_id, key)

    async def complete(self, asset_ids: list[str]) -> str | None:
        value = outputs_value(asset_ids)
        done = await self._until_taken(lambda: self._fenced(FencedWrite.COMPLETE, value))
        # None: either the owner asked to cancel meanwhile, or the lease is gone (the
        # cancel's acknowledgement then finds it so).
        return None if done is None else "succeeded"

    async def fail(self, failure: AttemptFailed) -> str:
        job, settings = self._job, self._settings
        delay = retry_delay(
            job.attempt,
            settings.backoff_base_seconds,
            settings.backoff_max_seconds,
            failure.retry_after_seconds,
        )
        after = await self._write(
            lambda: leases.fail(
                self._context.engine,
                job.job_id,
                job.lease_epoch,
                failure.code,
                failure.message,
                retryable=failure.retryable,
                retry_delay=delay,
                now=self._context.clock(),
            )
        )
        await self._purge_outputs()
        return "retrying" if after.status is Status.QUEUED else "failed"

    async def hand_back(self, delay: timedelta) -> HandedBack:
        job = self._job
        kept = await self._write(
            lambda: leases.hand_back(
                self._context.engine, job.job_id, job.lease_epoch, delay, self._context.clock()
            )
        )
        return HandedBack.CANCEL_ASKED if kept.cancel_requested else HandedBack.QUEUED

    async def acknowledge_cancel(self) -> str:
        await self._write(lambda: self._fenced(FencedWrite.ACKNOWLEDGE_CANCEL))
        await self._purge_outputs()
        return "cancelled"

    async def mark_outcome_unknown(self, error: ProviderError) -> str:
        lost = f"the provider's answer to the submit was lost ({error.code})"
        await self._write(lambda: self._fenced(FencedWrite.OUTCOME_UNKNOWN, lost))
        return "outcome_unknown"

    # --- writes -----------------------------------------------------------------------

    async def _write(self, write: Callable[[], Awaitable[W | None]]) -> W:
        """A fenced write: the job as written, or LeaseLost when it matched nothing."""
        job = await self._until_taken(write)
        if job is None:
            raise LeaseLost()
        if job.status.terminal:
            # This write ended the job: a beat that no longer finds the lease held must
            # not cancel what the attempt still does (a cancelled job's outputs' purge).
            self._lease.ended = True
            return job
        if self._lease.lost and job.status is Status.RUNNING:
            # A beat found the lease gone while this write was on its way: the write was
            # in time, but the job is another worker's now.
            raise LeaseLost()
        return job

    async def _until_taken(
        self, write: Callable[[], Awaitable[W | None]], past_the_lease: float = 0.0
    ) -> W | None:
        """``write()``'s answer; sent again while the database cannot take it, until the
        lease keeper gives the lease up (then LeaseLost), or, with ``past_the_lease``, for
        that many seconds more: the fence still refuses it once anybody else took the job.
        Sending a fenced write twice is safe when the first committed unseen (a server
        frozen mid-write runs it on waking): a status change is then refused by its fence,
        and a step marker writes the same step again."""
        pause = FIRST_WRITE_PAUSE_SECONDS
        loop = asyncio.get_running_loop()
        given_up_at: float | None = None
        # Held across the pauses too when the write may outlive the lease: the keeper then
        # leaves this attempt to end itself.
        async with self._lease.writing() if past_the_lease else contextlib.nullcontext():
            while True:
                try:
                    async with self._lease.writing():
                        return await write()
                except Exception as error:
                    outage = classify(error)
                    if outage is None:
                        raise
                    log_unavailable(
                        _OUTAGE_LOG, outage.dependency, outage.kind, job_id=self._job.job_id
                    )
                if self._lease.lost:
                    given_up_at = loop.time() if given_up_at is None else given_up_at
                    if loop.time() - given_up_at >= past_the_lease:
                        raise LeaseLost()
                WRITES_RETRIED.inc()
                # Outside ``writing`` (unless held above): a lease given up meanwhile
                # cancels the attempt here.
                await asyncio.sleep(pause)
                if self._lease.lost and not past_the_lease:
                    raise LeaseLost()
                pause = min(pause * 2, LONGEST_WRITE_PAUSE_SECONDS)

    def _fenced(self, write: FencedWrite, value: str | None = None) -> Awaitable[Written | None]:
        """One of this attempt's fenced writes, sent with whatever the process's other
        attempts write at the same moment."""
        job = self._job
        return self._context.writer.write(write, job.job_id, job.lease_epoch, value)

    async def _purge_outputs(self) -> None:
        """Deletes what this attempt may have landed, now that it ended without success
        (its end listed them). Shielded, so a cancel cannot cut it short; a failure only
        delays it to the reaper's next sweep."""
        if not self._requested:
            return  # nothing reached the provider: nothing can have landed
        job = self._job
        try:
            await asyncio.shield(
                output_purger.purge(self._context.engine, self._context.media, job_id=job.job_id)
            )
        except Exception as error:
            log.warning("outputs_purge_deferred", job_id=job.job_id, error=type(error).__name__)
