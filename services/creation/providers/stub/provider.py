"""The stub provider: a real two-phase backend that restyles the input with Pillow.

``submit`` accepts at once and stores the request (see journal.py); ``poll`` reports
progress rising over ``duration_seconds`` from the submit, then renders the outputs at the
size asked for (styles.py) off the event loop. A poll from any process that shares the
state directory gets the same answer, so a worker that resumes after a crash polls on and
never submits again. A request id it cannot find (another machine's, or a cleaned
directory) is answered ``Failed("REQUEST_UNKNOWN", retryable=True)``: the stub positively
has nothing running for it, so a fresh attempt is safe and is the only way to an image.

The stub can look its requests up by our reference (``find_requests``, ``describe``), as
a vendor that keeps the job id sent as metadata would: InspectJob, RESOLUTION_ADOPT and the
reaper's automatic recovery rely on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from services.creation.providers.base import (
    Done,
    Failed,
    GenerationRequest,
    PollResult,
    ProviderError,
    ProviderRequestInfo,
    RequestState,
    Running,
)
from services.creation.providers.failures import FAILURES
from services.creation.providers.stub.faults import FaultInjector, crash_point, injected_error
from services.creation.providers.stub.journal import (
    RequestStore,
    StubRequest,
    append_ledger,
    new_request_id,
)
from services.creation.providers.stub.styles import InputUnreadable, render
from services.creation.settings import CreationSettings, StubSettings

# What one request may ask for (the API's num_outputs bound).
MAX_OUTPUTS = 4
# Renders held at once: each costs memory in proportion to the pixels.
RENDER_SLOTS = 2


class StubProvider:
    code = "stub"
    version = "stub-1"
    # The stub does not deduplicate by idempotency key: a submit whose outcome is unknown
    # must go to NEEDS_ATTENTION, exactly as with a real provider that does not.
    supports_idempotent_submit = False

    def __init__(self, settings: StubSettings, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        # Wall-clock seconds: a submit's time must mean the same in every process.
        self._clock = clock
        self._store = RequestStore(Path(settings.state_dir))
        self._ledger = Path(settings.ledger_path) if settings.ledger_path else None
        self._faults = FaultInjector(settings.faults)
        self._render_slots = asyncio.Semaphore(RENDER_SLOTS)

    @classmethod
    def from_settings(cls, settings: CreationSettings) -> StubProvider:
        return cls(settings.stub)

    def _crash_point(self, name: str) -> None:
        crash_point(name, self._settings.crash_at or "")

    async def _latency(self) -> None:
        if self._settings.latency_seconds > 0:
            # Simulated network time; nothing to wait for but the clock.
            await asyncio.sleep(self._settings.latency_seconds)

    async def submit(self, request: GenerationRequest, idempotency_key: str) -> str:
        await self._latency()
        self._crash_point("before_submit")
        code = self._faults.next("submit")
        ambiguous = code is not None and FAILURES[code].ambiguous_on_submit
        if code is not None and not ambiguous:
            raise injected_error(code, "submit")
        if not 1 <= request.num_outputs <= MAX_OUTPUTS:
            raise ProviderError(
                "INVALID_INPUT",
                f"num_outputs must be 1 to {MAX_OUTPUTS} (got {request.num_outputs})",
                retryable=False,
            )
        accepted = StubRequest(
            request_id=new_request_id(),
            job_id=request.job_id,
            attempt=request.attempt,
            style_id=request.style_id,
            provider_model=request.provider_model,
            num_outputs=request.num_outputs,
            content_type=request.input_image.content_type if request.input_image else "",
            submitted_at=self._clock(),
            width=request.width,
            height=request.height,
            text_only=request.input_image is None,
            prompt=request.prompt if request.input_image is None else "",
        )
        input_data = request.input_image.data if request.input_image else b""
        try:
            await asyncio.to_thread(self._accept, accepted, input_data)
        except _NotStored as error:
            # Nothing was stored, so nothing was accepted: a plain, retryable refusal.
            raise _unavailable("store the request", error.cause) from None
        if code is not None:
            # A timeout after the provider accepted: the request runs, the id is lost.
            raise injected_error(code, "submit", outcome_unknown=True)
        self._crash_point("after_submit")
        return accepted.request_id

    def _accept(self, accepted: StubRequest, input_data: bytes) -> None:
        """Stores the request, then its ledger line, in one step of one thread (blocking).
        Between two steps a worker killed at random (the chaos test's) could leave an
        accepted request its ledger never listed: seen once in a clean run, a job that
        succeeded from a request no ledger line named. The window left is the one
        between the store's rename and the ledger's write, a few syscalls."""
        try:
            self._store.save(accepted, input_data)
        except OSError as error:
            raise _NotStored(error) from error
        if self._ledger is not None:
            append_ledger(self._ledger, accepted.job_id, accepted.request_id)

    async def poll(self, request_id: str) -> PollResult:
        await self._latency()
        self._crash_point("polling")
        injected = self._faults.on_poll()
        if injected is not None:
            return injected
        try:
            found = await asyncio.to_thread(self._store.load, request_id)
        except OSError as error:
            raise _unavailable("read the request", error) from None
        if found is None:
            return Failed("REQUEST_UNKNOWN", "the stub has no such request", retryable=True)
        accepted, input_data = found
        if accepted.cancelled:
            return Failed("CANCELLED", "the request was cancelled", retryable=False)
        progress = self._progress(accepted)
        if progress < 100:
            return Running(progress)
        async with self._render_slots:
            try:
                outputs = await asyncio.to_thread(
                    render,
                    input_data,
                    accepted.style_id,
                    accepted.num_outputs,
                    self._settings.max_input_pixels,
                    accepted.size,
                    accepted.prompt if accepted.text_only else None,
                )
            except InputUnreadable as error:
                return Failed("INPUT_UNREADABLE", str(error), retryable=False)
        return Done(outputs)

    def _progress(self, request: StubRequest) -> int:
        """0-99 while the duration runs, 100 once it is over."""
        duration = self._settings.duration_seconds
        elapsed = max(0.0, self._clock() - request.submitted_at)
        if elapsed >= duration:
            return 100
        return min(99, int(100 * elapsed / duration))

    async def find_requests(self, job_id: str) -> Sequence[ProviderRequestInfo]:
        await self._latency()
        try:
            found = await asyncio.to_thread(self._store.for_job, job_id)
        except OSError as error:
            raise _unavailable("list the job's requests", error) from None
        return [self._info(request) for request in found]

    async def describe(self, request_id: str) -> ProviderRequestInfo | None:
        await self._latency()
        try:
            found = await asyncio.to_thread(self._store.load, request_id)
        except OSError as error:
            raise _unavailable("read the request", error) from None
        return None if found is None else self._info(found[0])

    def _info(self, request: StubRequest) -> ProviderRequestInfo:
        """The request as the stub describes it, without rendering its output."""
        progress = self._progress(request)
        if request.cancelled:
            state = RequestState.CANCELLED
        elif progress < 100:
            state = RequestState.RUNNING
        else:
            # The render runs at poll; an unreadable input fails only then.
            state = RequestState.SUCCEEDED
        return ProviderRequestInfo(
            request_id=request.request_id,
            job_id=request.job_id,
            state=state,
            progress=progress,
            attempt=request.attempt,
            submitted_at=datetime.fromtimestamp(request.submitted_at, UTC),
        )

    async def cancel(self, request_id: str) -> None:
        await self._latency()
        code = self._faults.next("cancel")
        if code is not None:
            raise injected_error(code, "cancel")
        try:
            await asyncio.to_thread(self._store.cancel, request_id)
        except OSError as error:
            raise _unavailable("cancel the request", error) from None

    async def close(self) -> None:
        """Nothing to release: every request lives in the state directory."""


class _NotStored(Exception):
    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _unavailable(action: str, error: OSError) -> ProviderError:
    """The state directory failed: to the worker, the provider is unavailable."""
    return ProviderError(
        "UNAVAILABLE", f"the stub could not {action}: {error.strerror}", retryable=True
    )
