"""One attempt at one job, in DESIGN.md's order: read the input through media, commit
step SUBMITTING, submit, commit the request id at once, poll (progress goes to the lease
keeper), land the output through media, complete in one fenced transaction. A job whose
request id is already set resumes polling and never submits.

Every write is fenced by the lease; one that matches nothing ends the attempt without
another write. A write the database could not take (down, frozen, a lock wait given up)
is sent again for as long as the lease may still hold (the lease keeper says when it
cannot): a short outage must not cost the job its attempt, nor a submitted job its
request id (without it the job would wait for an operator).

Cancel and drain are honoured at safe points: before submitting and between polls.

Outputs are landed under idempotency keys of the job, the attempt and the output's index
(``domain.output_key``): a worker killed after landing leaves assets that the worker
resuming the attempt lands onto again, and an attempt that ends without success has
what it may have landed deleted by key (see ``output_purger``). So nothing landed is
orphaned, whichever point a worker dies at.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode
from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status, backoff, output_key
from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, AssetUnreadable
from services.creation.parameters import GenerationParameters
from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    InputImage,
    OutputImage,
    Provider,
    ProviderError,
    Running,
)
from services.creation.providers.failures import is_retryable
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite, Written, outputs_value
from services.creation.worker import output_purger
from services.creation.worker.context import AttemptContext
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
# How long an attempt waits before sending a write again, doubling up to the longest.
FIRST_WRITE_PAUSE_SECONDS = 0.25
LONGEST_WRITE_PAUSE_SECONDS = 2.0
T = TypeVar("T")
# What a fenced write answers: the whole job, or (batched writes) its status and version.
W = TypeVar("W", Job, Written)

# Consecutive poll errors the provider may answer with before the job is handed back
# (keeping its request) for a later poll.
POLL_ERRORS_BEFORE_HAND_BACK = 5
# The longest an attempt waits between polls while holding its provider slot; a provider
# asking for longer gets the job handed back with that delay (its request kept).
LONGEST_POLL_PAUSE = timedelta(seconds=60)
# Attempt endings that are failures of ours, not of the job (an error in its span).
_BROKEN = frozenset({"crashed", "database_unavailable"})
PROVIDER_CANCEL_TIMEOUT_SECONDS = 10.0


class Attempt:
    def __init__(self, job: Job, lease: Lease, context: AttemptContext) -> None:
        self._job = job
        self._lease = lease
        self._context = context
        self._settings = context.settings
        # Whether this attempt has a provider request: only then may it have landed
        # outputs that its end must purge.
        self._requested = job.provider_request_id is not None

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
            try:
                outcome = await self._run()
            except AttemptFailed as failure:
                outcome = await self._fail(failure)
        except LeaseLost:
            # Whatever this attempt landed belongs to whoever holds the job now: the
            # worker resuming the attempt lands onto it, or its end purges it.
            outcome = "lease_lost"
        except Exception as error:
            # The database gone mid-write, or a bug: stop beating, so the lease expires and
            # the reaper decides by step. An outage is one short line, a bug its trace.
            outage = classify(error)
            if outage is None:
                log.exception("attempt_crashed", job_id=job.job_id, attempt=job.attempt)
            else:
                log_unavailable(_OUTAGE_LOG, outage.dependency, outage.kind, job_id=job.job_id)
            outcome = "crashed" if outage is None else "database_unavailable"
        log.info(
            "attempt_ended",
            job_id=job.job_id,
            attempt=job.attempt,
            lease_epoch=job.lease_epoch,
            outcome=outcome,
        )
        self._context.outcomes.record(job.job_id, outcome)
        return outcome

    async def _run(self) -> str:
        job = self._job
        provider = self._context.providers.get(job.provider_code)
        if provider is None:
            raise AttemptFailed(
                "PROVIDER_NOT_CONFIGURED",
                f"no provider adapter for {job.provider_code!r}",
                retryable=False,
            )
        request_id = job.provider_request_id
        if request_id is None:
            stopped = await self._stop_before_submit()
            if stopped is not None:
                return stopped
        # One of the provider's slots in this process, from submit (or the first poll of
        # a resumed job) to the end of polling; the wait gives way to a cancel or a drain.
        async with self._context.limits.slot(job.provider_code, self._stops(request_id)) as held:
            if not held:
                return await self._stopped_waiting(provider, request_id)
            if request_id is None:
                image = await self._read_input()
                # Reading took a while: the owner or a drain may have spoken meanwhile.
                stopped = await self._stop_before_submit()
                if stopped is not None:
                    return stopped
                request = await self._request(image)
                gate = self._context.limits.gate(job.provider_code)
                if not await gate.submit_token(self._stops(None)):
                    return await self._stopped_waiting(provider, None)
                submitted = await self._submit(provider, request)
                if submitted is None:
                    return "outcome_unknown"
                request_id = submitted
            outputs = await self._poll(provider, request_id)
        if isinstance(outputs, str):
            return outputs
        return await self._land_and_complete(outputs)

    def _stops(self, request_id: str | None) -> list[asyncio.Event]:
        """What ends a wait for the provider's limits: the owner's cancel, and the drain
        (asked: before a submit; due: for a job with a request, which polls till then)."""
        drain = self._context.drain
        return [self._lease.cancel_requested, drain.asked if request_id is None else drain.due]

    async def _stopped_waiting(self, provider: Provider, request_id: str | None) -> str:
        if request_id is None:
            stopped = await self._stop_before_submit()
            if stopped is not None:
                return stopped
        elif self._lease.cancel_requested.is_set():
            return await self._cancel(provider, request_id)
        return await self._hand_back(timedelta(0))

    # --- before the provider ----------------------------------------------------------

    async def _stop_before_submit(self) -> str | None:
        if self._lease.cancel_requested.is_set():
            return await self._acknowledge_cancel()
        if self._context.drain.asked.is_set():
            return await self._hand_back(timedelta(0))
        return None

    async def _read_input(self) -> InputImage:
        job = self._job
        try:
            read = await self._context.media.read_asset(
                job.input_asset_id, self._settings.worker.max_input_bytes
            )
        except AssetUnreadable as error:
            raise AttemptFailed("INPUT_UNREADABLE", str(error), retryable=False) from None
        except MediaUnavailable:
            raise AttemptFailed(
                "MEDIA_UNAVAILABLE", "media did not hand over the input", retryable=True
            ) from None
        return InputImage(read.data, read.content_type)

    async def _request(self, image: InputImage) -> GenerationRequest:
        job = self._job
        input_url = None
        if self._settings.providers.input_mode == "url":
            # A signed URL the provider fetches itself; media unable to give one leaves
            # the bytes inline (logged by the client).
            signed = await self._context.media.download_url(job.input_asset_id)
            input_url = signed.url if signed is not None else None
        return GenerationRequest(
            job_id=job.job_id,
            attempt=job.attempt,
            provider_model=job.provider_model,
            style_id=job.style_id,
            prompt=job.prompt,
            negative_prompt=job.negative_prompt,
            width=job.width,
            height=job.height,
            input_image=image,
            parameters=GenerationParameters.from_stored(job.parameters),
            num_outputs=job.num_outputs,
            input_url=input_url,
        )

    async def _submit(self, provider: Provider, request: GenerationRequest) -> str | None:
        """The request id, committed; None when the submit's outcome is unknown (the job
        then waits for an operator)."""
        job = self._job
        self._context.on_point("before_submit")
        await self._write(lambda: self._fenced(FencedWrite.MARK_SUBMITTING, provider.version))
        # With the time, what an operator matches against the provider's own request list
        # when the answer to this submit is lost (neither vendor takes a client reference).
        log.info(
            "submit_started",
            job_id=job.job_id,
            attempt=job.attempt,
            provider=provider.code,
            provider_version=provider.version,
            provider_model=request.provider_model,
        )
        try:
            request_id = await self._provider_call(
                provider.submit(request, f"{job.job_id}:{job.attempt}"), "submit"
            )
        except ProviderError as error:
            if error.outcome_unknown and not provider.supports_idempotent_submit:
                log.warning("submit_outcome_unknown", job_id=job.job_id, code=error.code)
                lost = f"the provider's answer to the submit was lost ({error.code})"
                await self._write(lambda: self._fenced(FencedWrite.OUTCOME_UNKNOWN, lost))
                return None
            raise AttemptFailed(
                error.code,
                error.message,
                retryable=is_retryable(error.code, error.retryable),
                retry_after_seconds=error.retry_after_seconds,
            ) from None
        self._context.on_point("after_submit")
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
                    provider=provider.code,
                    request_id=request_id,
                )
        if recorded is None:
            raise LeaseLost()  # refused by the fence: the job is somebody else's
        if self._lease.lost:
            # Recorded, but the lease is gone (most often given up while the database did
            # not answer): the reaper resumes the job from this id, no operator needed.
            log.info("request_id_recorded_without_the_lease", job_id=job.job_id)
            raise LeaseLost()
        return request_id

    # --- while the provider works -----------------------------------------------------

    async def _poll(self, provider: Provider, request_id: str) -> Sequence[OutputImage] | str:
        """The provider's outputs, or how the attempt ended instead (cancelled, handed
        back)."""
        errors = 0
        while True:
            self._context.on_point("polling")
            if self._lease.cancel_requested.is_set():
                return await self._cancel(provider, request_id)
            if self._context.drain.due.is_set():
                return await self._hand_back(timedelta(0))
            try:
                result = await self._provider_call(provider.poll(request_id), "poll")
            except ProviderError as error:
                if not is_retryable(error.code, error.retryable):
                    raise AttemptFailed(error.code, error.message, retryable=False) from None
                errors += 1
                delay = self._backoff(errors)
                if error.retry_after_seconds is not None:
                    # The provider said when to ask again (a 429's Retry-After): never
                    # sooner; a long wait is the queue's, not a slot's.
                    delay = max(delay, timedelta(seconds=error.retry_after_seconds))
                if errors >= POLL_ERRORS_BEFORE_HAND_BACK or delay > LONGEST_POLL_PAUSE:
                    return await self._hand_back(delay)
                await self._pause(delay.total_seconds())
                continue
            errors = 0
            if isinstance(result, Done):
                return result.outputs
            if isinstance(result, Failed):
                raise AttemptFailed(
                    result.code,
                    result.message,
                    retryable=is_retryable(result.code, result.retryable),
                )
            if isinstance(result, Running):
                self._lease.report(result.progress)
            await self._pause(self._settings.worker.provider_poll_seconds)

    async def _pause(self, seconds: float) -> None:
        """Waits between polls; a cancel request or a due drain cuts it short."""
        waiters = [
            asyncio.ensure_future(self._lease.cancel_requested.wait()),
            asyncio.ensure_future(self._context.drain.due.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # --- after the provider -----------------------------------------------------------

    async def _land_and_complete(self, outputs: Sequence[OutputImage]) -> str:
        job = self._job
        if len(outputs) < job.num_outputs:
            raise AttemptFailed(
                "NO_OUTPUT",
                f"the provider returned {len(outputs)} of {job.num_outputs} images",
                retryable=True,
            )
        landed: list[str] = []
        for index, output in enumerate(outputs[: job.num_outputs]):
            try:
                asset_id = await self._context.media.put_asset(
                    job.user_id,
                    "ai_output",
                    output.content_type,
                    output.data,
                    idempotency_key=output_key(job.job_id, job.attempt, index),
                )
            except AssetRefused as error:
                raise AttemptFailed("OUTPUT_REJECTED", str(error), retryable=True) from None
            except MediaUnavailable:
                # The provider keeps the result a while: poll it again later. What landed
                # stays; the resumed attempt lands onto the same assets.
                return await self._hand_back(self._backoff(1))
            landed.append(asset_id)
            self._context.on_point("after_output")
        if self._lease.cancel_requested.is_set():
            return await self._acknowledge_cancel()
        self._context.on_point("before_complete")
        value = outputs_value(landed)
        done = await self._until_taken(lambda: self._fenced(FencedWrite.COMPLETE, value))
        if done is None:
            # Either the owner asked to cancel meanwhile, or the lease is gone.
            return await self._acknowledge_cancel()
        return "succeeded"

    # --- endings ----------------------------------------------------------------------

    async def _cancel(self, provider: Provider, request_id: str) -> str:
        try:
            await asyncio.wait_for(provider.cancel(request_id), PROVIDER_CANCEL_TIMEOUT_SECONDS)
        except (ProviderError, TimeoutError) as error:
            # The job is cancelled for the user either way; its output is never attached.
            log.warning("provider_cancel_failed", job_id=self._job.job_id, error=str(error))
        return await self._acknowledge_cancel()

    async def _acknowledge_cancel(self) -> str:
        await self._write(lambda: self._fenced(FencedWrite.ACKNOWLEDGE_CANCEL))
        await self._purge_outputs()
        return "cancelled"

    async def _hand_back(self, delay: timedelta) -> str:
        job = self._job
        kept = await self._write(
            lambda: leases.hand_back(self._engine, job.job_id, job.lease_epoch, delay, self._now())
        )
        if kept.cancel_requested:
            # The owner asked to cancel before we could hand it back: cancel it instead.
            self._lease.cancel_requested.set()
            provider = self._context.providers.get(job.provider_code)
            if kept.provider_request_id is not None and provider is not None:
                return await self._cancel(provider, kept.provider_request_id)
            return await self._acknowledge_cancel()
        return "handed_back"

    async def _fail(self, failure: AttemptFailed) -> str:
        job = self._job
        if self._lease.cancel_requested.is_set():
            return await self._acknowledge_cancel()
        delay = self._backoff(job.attempt)
        if failure.retry_after_seconds is not None:
            delay = max(delay, timedelta(seconds=failure.retry_after_seconds))
        after = await self._write(
            lambda: leases.fail(
                self._engine,
                job.job_id,
                job.lease_epoch,
                failure.code,
                failure.message,
                retryable=failure.retryable,
                retry_delay=delay,
                now=self._now(),
            )
        )
        log.info(
            "attempt_failed", job_id=job.job_id, code=failure.code, retryable=failure.retryable
        )
        await self._purge_outputs()
        return "retrying" if after.status is Status.QUEUED else "failed"

    # --- helpers ----------------------------------------------------------------------

    async def _provider_call(self, call: Awaitable[T], name: str) -> T:
        """A provider call whose unexpected exception (an adapter's bug) is a provider
        error like any other: retryable, and for a submit of unknown outcome (it may have
        reached the provider), so it is never sent twice."""
        try:
            return await call
        except ProviderError:
            raise
        except Exception as error:
            log.exception("provider_call_raised", job_id=self._job.job_id, call=name)
            raise ProviderError(
                "PROVIDER_BUG",
                f"the adapter's {name} raised {type(error).__name__}",
                retryable=True,
                outcome_unknown=name == "submit",
            ) from error

    async def _write(self, write: Callable[[], Awaitable[W | None]]) -> W:
        """A fenced write: the job as written, or LeaseLost when it matched nothing."""
        job = await self._until_taken(write)
        if job is None:
            raise LeaseLost()
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
                output_purger.purge(self._engine, self._context.media, job_id=job.job_id)
            )
        except Exception as error:
            log.warning("outputs_purge_deferred", job_id=job.job_id, error=type(error).__name__)

    def _backoff(self, attempt: int) -> timedelta:
        return backoff(
            attempt, self._settings.backoff_base_seconds, self._settings.backoff_max_seconds
        )

    def _now(self) -> datetime:
        return self._context.clock()

    @property
    def _engine(self) -> AsyncEngine:
        return self._context.engine
