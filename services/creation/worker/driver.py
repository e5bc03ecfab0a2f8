"""The attempt driver: the one place an attempt's policy lives, for the in-process worker
and the remote worker alike. In DESIGN.md's order: mark SUBMITTING, submit, record the
request id at once, poll (the provider's ``retry_after_seconds`` honoured, one backoff;
progress reported), land the outputs and complete. Or: fail (retryable or not), hand the
job back (its request kept), leave a submit of unknown outcome to an operator
(NEEDS_ATTENTION), acknowledge the owner's cancel, abandon a job whose lease is lost. A
job whose request id is set resumes polling and never submits.

Cancel and drain are honoured at safe points: before submitting and between polls; a
cancel asked for wins over a failure.

How each step is written is a port's (:class:`AttemptPort`): the in-process worker's
fenced-store adapter (``worker/attempt.py``: batched fenced writes, sent again through a
database outage) and the remote worker's WorkerService-client adapter
(``remote_worker/attempt.py``). What follows from each answer is decided here.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar

from services.creation.domain import retry_delay
from services.creation.parameters import Parameters
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
from services.creation.providers.limits import ProviderLimits
from services.creation.worker.context import Drain, PointHook, no_point
from services.creation.worker.outcomes import AttemptFailed, CancelAsked, LeaseLost
from services.kit.logging import get_logger

log = get_logger(__name__)
T = TypeVar("T")

# Consecutive poll errors the provider may answer with before the job is handed back
# (keeping its request) for a later poll.
POLL_ERRORS_BEFORE_HAND_BACK = 5
# The longest an attempt waits between polls while holding its provider slot; a provider
# asking for longer gets the job handed back with that delay (its request kept).
LONGEST_POLL_PAUSE = timedelta(seconds=60)
PROVIDER_CANCEL_TIMEOUT_SECONDS = 10.0


class JobFields(Protocol):
    """The job's fields the driver reads, named alike on the row (``domain.Job``) and on
    a remote worker's claim (``ClaimedJob``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def provider_code(self) -> str: ...
    @property
    def provider_model(self) -> str: ...
    @property
    def style_id(self) -> str: ...
    @property
    def prompt(self) -> str: ...
    @property
    def negative_prompt(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def num_outputs(self) -> int: ...


@dataclass(frozen=True)
class AttemptJob:
    """The job an attempt runs, with what its two sources hold in their own shapes."""

    fields: JobFields
    # The provider's idempotency key for this attempt's submit.
    submit_key: str
    parameters: Parameters
    provider_request_id: str | None
    # False for a job made from the prompt alone: there is no input to read.
    has_input: bool = True


@dataclass(frozen=True)
class PollPolicy:
    """How often a running job asks its provider, and the backoff (full jitter) after a
    poll error or a failure."""

    poll_seconds: float
    backoff_base_seconds: float
    backoff_max_seconds: float

    def delay(self, count: int, at_least_seconds: float | None = None) -> timedelta:
        """The pause after the ``count``-th error, never shorter than the provider asked."""
        return retry_delay(
            count, self.backoff_base_seconds, self.backoff_max_seconds, at_least_seconds
        )


class HandedBack(enum.Enum):
    """What a hand-back did."""

    QUEUED = "queued"  # queued again with what it has
    CANCEL_ASKED = "cancel_asked"  # kept running: the owner asked to cancel; cancel it
    CANCELLED = "cancelled"  # the owner had asked to cancel: cancelled instead


class AttemptPort(Protocol):
    """How one attempt's steps reach the job. A write the job's lease no longer allows
    raises LeaseLost; one refused for the owner's cancel may raise CancelAsked; a
    failure of the job (an input unreadable, an output refused) raises AttemptFailed.
    The endings answer how the attempt ended (the log's action for it)."""

    @property
    def cancel_requested(self) -> asyncio.Event:
        """Set once this side learns the owner asked to cancel."""
        ...

    async def read_input(self) -> InputImage: ...

    async def input_url(self) -> str | None:
        """A signed URL the provider fetches the input from, or None (sent inline)."""
        ...

    async def mark_submitting(self, provider_version: str) -> None: ...

    async def record_request(self, request_id: str) -> None: ...

    def report_progress(self, percent: int) -> None: ...

    async def land_outputs(self, outputs: Sequence[OutputImage]) -> list[str] | None:
        """The landed outputs' asset ids, in order; None when they cannot land now (the
        provider keeps them a while: the job is handed back)."""
        ...

    async def complete(self, asset_ids: list[str]) -> str | None:
        """None when the fence refused it (the owner asked to cancel, or the lease is
        gone): the cancel's acknowledgement follows, which a lost lease refuses."""
        ...

    async def fail(self, failure: AttemptFailed) -> str: ...

    async def hand_back(self, delay: timedelta) -> HandedBack: ...

    async def acknowledge_cancel(self) -> str: ...

    async def mark_outcome_unknown(self, error: ProviderError) -> str: ...


class AttemptDriver:
    """One attempt at one job, by the policy above, through ``port``."""

    def __init__(
        self,
        job: AttemptJob,
        port: AttemptPort,
        provider: Provider | None,
        *,
        drain: Drain,
        policy: PollPolicy,
        limits: ProviderLimits,
        on_point: PointHook = no_point,
    ) -> None:
        self._job = job.fields
        self._attempt = job
        self._port = port
        self._provider = provider
        self._drain = drain
        self._policy = policy
        self._limits = limits
        self._on_point = on_point
        self._request_id = job.provider_request_id

    async def run(self) -> str:
        """Runs the attempt; how it ended. Any other error (the database gone, a
        refusal, a bug) is the caller's to log: the lease then runs out and the reaper
        decides by the job's step."""
        try:
            try:
                try:
                    return await self._run()
                except AttemptFailed as failure:
                    return await self._fail(failure)
            except CancelAsked:
                return await self._cancel()
        except LeaseLost:
            # Whatever this attempt landed belongs to whoever holds the job now: the
            # worker resuming the attempt lands onto it, or its end purges it.
            return "lease_lost"

    async def _run(self) -> str:
        job = self._job
        provider = self._provider
        if provider is None:
            raise AttemptFailed(
                "PROVIDER_NOT_CONFIGURED",
                f"no provider adapter for {job.provider_code!r}",
                retryable=False,
            )
        if self._request_id is None:
            stopped = await self._stop_before_submit()
            if stopped is not None:
                return stopped
        # One of the provider's slots in this process, from submit (or the first poll of
        # a resumed job) to the end of polling; the wait gives way to a cancel or a drain.
        async with self._limits.slot(job.provider_code, self._stops()) as held:
            if not held:
                return await self._stopped_waiting()
            if self._request_id is None:
                image = await self._port.read_input() if self._attempt.has_input else None
                # Reading took a while: the owner or a drain may have spoken meanwhile.
                stopped = await self._stop_before_submit()
                if stopped is not None:
                    return stopped
                request = await self._request(image)
                gate = self._limits.gate(job.provider_code)
                if not await gate.submit_token(self._stops()):
                    return await self._stopped_waiting()
                ended = await self._submit(provider, request)
                if ended is not None:
                    return ended
            outputs = await self._poll(provider)
        if isinstance(outputs, str):
            return outputs
        return await self._land_and_complete(outputs)

    def _stops(self) -> list[asyncio.Event]:
        """What ends a wait for the provider's limits: the owner's cancel, and the drain
        (asked: before a submit; due: for a job with a request, which polls till then)."""
        drain = self._drain
        return [self._port.cancel_requested, drain.asked if self._request_id is None else drain.due]

    async def _stopped_waiting(self) -> str:
        if self._request_id is None:
            stopped = await self._stop_before_submit()
            if stopped is not None:
                return stopped
        elif self._port.cancel_requested.is_set():
            return await self._cancel()
        return await self._hand_back(timedelta(0))

    # --- before the provider ----------------------------------------------------------

    async def _stop_before_submit(self) -> str | None:
        if self._port.cancel_requested.is_set():
            return await self._port.acknowledge_cancel()
        if self._drain.asked.is_set():
            return await self._hand_back(timedelta(0))
        return None

    async def _request(self, image: InputImage | None) -> GenerationRequest:
        job = self._job
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
            parameters=self._attempt.parameters,
            num_outputs=job.num_outputs,
            input_url=await self._port.input_url() if image is not None else None,
        )

    async def _submit(self, provider: Provider, request: GenerationRequest) -> str | None:
        """None once the request id is recorded; how the attempt ended otherwise (a
        submit of unknown outcome waits for an operator)."""
        job = self._job
        self._on_point("before_submit")
        await self._port.mark_submitting(provider.version)
        # What an operator matches against the provider's own request list when the answer
        # to a submit is lost (neither vendor takes a client reference): the time, attempt,
        # adapter version and model. A line per job at INFO was most of the engine's log
        # cost, and only a lost answer needs it, so it is DEBUG here and the same fields
        # go with the WARNING submit_outcome_unknown below. A worker killed mid-submit logs
        # nothing; its job keeps the window in the database: provider_version on the row,
        # the RUNNING event of the claim and the reaper's NEEDS_ATTENTION event.
        started_at = datetime.now(UTC)
        submitted = {
            "job_id": job.job_id,
            "attempt": job.attempt,
            "provider": provider.code,
            "provider_version": provider.version,
            "provider_model": request.provider_model,
        }
        log.debug("submit_started", **submitted)
        try:
            request_id = await self._provider_call(
                provider.submit(request, self._attempt.submit_key), "submit"
            )
        except ProviderError as error:
            if error.outcome_unknown and not provider.supports_idempotent_submit:
                log.warning(
                    "submit_outcome_unknown",
                    code=error.code,
                    submit_started_at=started_at.isoformat(timespec="milliseconds"),
                    **submitted,
                )
                return await self._port.mark_outcome_unknown(error)
            raise AttemptFailed(
                error.code,
                error.message,
                retryable=is_retryable(error.code, error.retryable),
                retry_after_seconds=error.retry_after_seconds,
            ) from None
        self._on_point("after_submit")
        # Known from here on: a cancel tells the provider.
        self._request_id = request_id
        await self._port.record_request(request_id)
        return None

    # --- while the provider works -----------------------------------------------------

    async def _poll(self, provider: Provider) -> Sequence[OutputImage] | str:
        """The provider's outputs, or how the attempt ended instead (cancelled, handed
        back)."""
        request_id = self._request_id
        assert request_id is not None  # submitted, or resumed with its request
        errors = 0
        while True:
            self._on_point("polling")
            if self._port.cancel_requested.is_set():
                return await self._cancel()
            if self._drain.due.is_set():
                return await self._hand_back(timedelta(0))
            try:
                result = await self._provider_call(provider.poll(request_id), "poll")
            except ProviderError as error:
                if not is_retryable(error.code, error.retryable):
                    raise AttemptFailed(error.code, error.message, retryable=False) from None
                errors += 1
                # The provider may say when to ask again (a 429's Retry-After): never
                # sooner; a long wait is the queue's, not a slot's.
                delay = self._policy.delay(errors, error.retry_after_seconds)
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
                self._port.report_progress(max(0, min(100, result.progress)))
            await self._pause(self._policy.poll_seconds)

    async def _pause(self, seconds: float) -> None:
        """Waits between polls; a cancel request or a due drain cuts it short."""
        waiters = [
            asyncio.ensure_future(self._port.cancel_requested.wait()),
            asyncio.ensure_future(self._drain.due.wait()),
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
        landed = await self._port.land_outputs(outputs[: job.num_outputs])
        if landed is None:
            # The provider keeps the result a while: poll it again later. What landed
            # stays; the resumed attempt lands onto the same assets.
            return await self._hand_back(self._policy.delay(1))
        if self._port.cancel_requested.is_set():
            return await self._port.acknowledge_cancel()
        self._on_point("before_complete")
        done = await self._port.complete(landed)
        if done is None:
            # The owner asked to cancel meanwhile.
            return await self._port.acknowledge_cancel()
        return done

    # --- endings ----------------------------------------------------------------------

    async def _cancel(self) -> str:
        provider, request_id = self._provider, self._request_id
        if provider is not None and request_id is not None:
            try:
                await asyncio.wait_for(provider.cancel(request_id), PROVIDER_CANCEL_TIMEOUT_SECONDS)
            except (ProviderError, TimeoutError) as error:
                # The job is cancelled for the user either way; its output is never
                # attached.
                log.warning("provider_cancel_failed", job_id=self._job.job_id, error=str(error))
        return await self._port.acknowledge_cancel()

    async def _hand_back(self, delay: timedelta) -> str:
        handed = await self._port.hand_back(delay)
        if handed is HandedBack.QUEUED:
            return "handed_back"
        if handed is HandedBack.CANCELLED:
            return "cancelled"
        # The owner asked to cancel before we could hand it back: cancel it instead.
        self._port.cancel_requested.set()
        return await self._cancel()

    async def _fail(self, failure: AttemptFailed) -> str:
        job = self._job
        if self._port.cancel_requested.is_set():
            return await self._port.acknowledge_cancel()
        outcome = await self._port.fail(failure)
        # The error is on the job (error_code, its events); attempts are counted by outcome.
        log.debug(
            "attempt_failed", job_id=job.job_id, code=failure.code, retryable=failure.retryable
        )
        return outcome

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
