"""What a job's provider holds for it: the request the job recorded and those the
adapter's lookup finds by our reference (the job id sent at submit). InspectJob shows it,
RESOLUTION_ADOPT checks a request against it, and the reaper's automatic recovery adopts
when it finds exactly one. Every provider call has a deadline; an adapter without a
lookup (providers.base.RequestLookup) says why instead."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from services.creation.domain import Job
from services.creation.errors import (
    ProviderRequestNotFound,
    ProviderRequestOfAnotherJob,
    ProviderUnavailable,
)
from services.creation.providers.base import (
    Provider,
    ProviderError,
    ProviderRequestInfo,
    RequestLookup,
    lookup_note,
    lookup_of,
)
from services.kit.logging import get_logger

log = get_logger(__name__)

# A lookup is an operator's question or a reaper's sweep: it must not hang either.
LOOKUP_TIMEOUT_SECONDS = 10.0


class LiveState(enum.StrEnum):
    """A request's state at its provider as InspectJob reports it."""

    UNKNOWN = "unknown"  # not asked: the adapter cannot describe a request
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NOT_FOUND = "not_found"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class SeenRequest:
    """One request of the job at its provider."""

    request_id: str
    recorded: bool
    found: bool
    state: LiveState
    progress: int = 0
    attempt: int = 0
    submitted_at: datetime | None = None
    detail: str = ""


@dataclass(frozen=True)
class ProviderView:
    """What the job's provider holds for it."""

    requests: list[SeenRequest]
    lookup_supported: bool
    # Why the lookup could not run or failed this time; "" when it ran.
    note: str = ""


def _seen(info: ProviderRequestInfo, *, recorded: bool, found: bool) -> SeenRequest:
    return SeenRequest(
        request_id=info.request_id,
        recorded=recorded,
        found=found,
        state=LiveState(info.state.value),
        progress=info.progress,
        attempt=info.attempt,
        submitted_at=info.submitted_at,
        detail=info.detail,
    )


class ProviderRequests:
    """Lookups on the adapters by provider code (the same registry the workers use)."""

    def __init__(
        self, providers: Mapping[str, Provider], timeout_seconds: float = LOOKUP_TIMEOUT_SECONDS
    ) -> None:
        self._providers = providers
        self._timeout = timeout_seconds

    def _lookup(self, job: Job) -> tuple[RequestLookup | None, str]:
        provider = self._providers.get(job.provider_code)
        if provider is None:
            return None, f"no adapter has provider code {job.provider_code!r} in this process"
        found = lookup_of(provider)
        return (found, "") if found is not None else (None, lookup_note(provider))

    async def view(self, job: Job) -> ProviderView:
        """The recorded request (described when the adapter can) and every request the
        lookup finds, each once, recorded first. A provider that fails to answer is
        reported in the view, never raised: the operator still sees the job."""
        recorded = job.provider_request_id
        lookup, note = self._lookup(job)
        if lookup is None:
            requests = (
                [] if recorded is None else [SeenRequest(recorded, True, False, LiveState.UNKNOWN)]
            )
            return ProviderView(requests, lookup_supported=False, note=note)
        try:
            found = await asyncio.wait_for(lookup.find_requests(job.job_id), self._timeout)
        except (ProviderError, TimeoutError) as error:
            detail = _failure(error)
            log.warning("provider_lookup_failed", job_id=job.job_id, error=detail)
            requests = (
                []
                if recorded is None
                else [SeenRequest(recorded, True, False, LiveState.UNREACHABLE, detail=detail)]
            )
            return ProviderView(requests, lookup_supported=True, note=f"lookup failed: {detail}")
        requests = [_seen(i, recorded=i.request_id == recorded, found=True) for i in found]
        if recorded is not None and all(i.request_id != recorded for i in found):
            # Recorded but not listed for this job (another job's, or gone): say what it is.
            requests.insert(0, await self._describe_recorded(lookup, recorded))
        else:
            requests.sort(key=lambda r: not r.recorded)
        return ProviderView(requests, lookup_supported=True)

    async def _describe_recorded(self, lookup: RequestLookup, request_id: str) -> SeenRequest:
        try:
            info = await asyncio.wait_for(lookup.describe(request_id), self._timeout)
        except (ProviderError, TimeoutError) as error:
            return SeenRequest(
                request_id, True, False, LiveState.UNREACHABLE, detail=_failure(error)
            )
        if info is None:
            return SeenRequest(request_id, True, False, LiveState.NOT_FOUND)
        return _seen(info, recorded=True, found=False)

    async def check_adoptable(self, job: Job, request_id: str) -> None:
        """Refuses a request the adapter can see is not this job's: one it does not hold
        (ProviderRequestNotFound) or holds for another job (ProviderRequestOfAnotherJob).
        An adapter without a lookup takes the operator's word (the vendor's dashboard)."""
        lookup, _ = self._lookup(job)
        if lookup is None:
            return
        try:
            info = await asyncio.wait_for(lookup.describe(request_id), self._timeout)
        except (ProviderError, TimeoutError) as error:
            raise ProviderUnavailable(job.provider_code, _failure(error)) from None
        if info is None:
            raise ProviderRequestNotFound(job.provider_code)
        if info.job_id != job.job_id:
            raise ProviderRequestOfAnotherJob()

    async def sole_request(self, job: Job) -> str | None:
        """The request id when the lookup finds exactly one for the job; None when it
        finds none or several, cannot look, or the provider does not answer (a person
        decides then)."""
        lookup, _ = self._lookup(job)
        if lookup is None:
            return None
        try:
            found = await asyncio.wait_for(lookup.find_requests(job.job_id), self._timeout)
        except (ProviderError, TimeoutError) as error:
            log.warning("provider_lookup_failed", job_id=job.job_id, error=_failure(error))
            return None
        return found[0].request_id if len(found) == 1 else None


def _failure(error: ProviderError | TimeoutError) -> str:
    if isinstance(error, ProviderError):
        return f"{error.code}: {error.message}"
    return "the provider did not answer in time"
