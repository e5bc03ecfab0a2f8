"""The two-phase provider interface every image-generation backend implements.

A generation is never one call: ``submit`` hands the provider a request and returns its
id at once, ``poll`` asks how it is going, ``cancel`` asks it to stop. The worker commits
the request id before it polls, so a crash after ``submit`` never leads to a second
submit (see DESIGN.md, "The provider is two-phase").
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from services.creation.parameters import Parameters


@dataclass(frozen=True)
class InputImage:
    """The user's photo, as media stored it."""

    data: bytes
    content_type: str


@dataclass(frozen=True)
class GenerationRequest:
    """What one attempt asks of a provider: the job's catalog snapshot and inputs."""

    job_id: str
    attempt: int
    provider_model: str
    style_id: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    # None: the job has no input image (a text-to-image model); generate from the prompt.
    input_image: InputImage | None
    parameters: Parameters = field(default_factory=dict)
    num_outputs: int = 1
    # A short-lived signed GET URL of the input (media's), given when the settings say the
    # vendors can reach our storage (ATELIER_PROVIDER_INPUT=url); otherwise None and a
    # hosted adapter sends ``input_image`` inline as a data URI.
    input_url: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class OutputImage:
    data: bytes
    content_type: str
    width: int
    height: int


@dataclass(frozen=True)
class Running:
    """Still generating; ``progress`` (0-100) counts within this attempt."""

    progress: int


@dataclass(frozen=True)
class Done:
    outputs: Sequence[OutputImage]


@dataclass(frozen=True)
class Failed:
    """The provider answered that the generation failed. ``code`` is stable (see the
    failure table); ``retryable`` says whether a new attempt may succeed."""

    code: str
    message: str
    retryable: bool


PollResult = Running | Done | Failed


class ProviderError(Exception):
    """A call that got no answer the worker can stand by: a timeout, a refused or reset
    connection, a 5xx, a rate limit. ``outcome_unknown`` is True when a submit may have
    reached the provider although no request id came back: never submit again then."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        outcome_unknown: bool = False,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.outcome_unknown = outcome_unknown
        self.retry_after_seconds = retry_after_seconds


class Provider(Protocol):
    """One backend. ``code`` matches the catalog's ``provider_code``; ``version`` is
    recorded with each job it runs."""

    code: str
    version: str
    # True only when the backend itself deduplicates submits by our idempotency key, so a
    # submit whose outcome is unknown may safely be sent again.
    supports_idempotent_submit: bool

    async def submit(self, request: GenerationRequest, idempotency_key: str) -> str:
        """Starts a generation; returns the provider's request id."""
        ...

    async def poll(self, request_id: str) -> PollResult: ...

    async def cancel(self, request_id: str) -> None:
        """Asks the provider to stop; harmless for a request that already finished."""
        ...

    async def close(self) -> None: ...


class RequestState(enum.StrEnum):
    """A provider request's state as its provider describes it (without its output)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ProviderRequestInfo:
    """One request as the provider holds it, by our reference: the job (and attempt) it
    was submitted for, as we sent them at submit."""

    request_id: str
    job_id: str
    state: RequestState
    progress: int = 0
    # The job attempt that submitted it; 0 when the provider did not keep it.
    attempt: int = 0
    submitted_at: datetime | None = None
    detail: str = ""


@runtime_checkable
class RequestLookup(Protocol):
    """An adapter whose provider can find requests by our reference (the job id we sent
    at submit, as metadata or idempotency key) and describe one without fetching its
    output. What makes an unknown submit outcome knowable: InspectJob, RESOLUTION_ADOPT's
    check, and the reaper's automatic recovery use it. Adapters whose vendor keeps no
    client reference do not implement it and say why in ``lookup_note``."""

    async def find_requests(self, job_id: str) -> Sequence[ProviderRequestInfo]:
        """Every request the provider holds for ``job_id``, oldest first."""
        ...

    async def describe(self, request_id: str) -> ProviderRequestInfo | None:
        """The request, None when the provider holds no such request."""
        ...


NO_LOOKUP_NOTE = "this adapter cannot look requests up by our reference"


def lookup_of(provider: Provider) -> RequestLookup | None:
    """The provider's lookup, None when it has none."""
    return provider if isinstance(provider, RequestLookup) else None


def lookup_note(provider: Provider) -> str:
    """Why ``provider`` cannot look requests up, and where an operator looks instead."""
    note = getattr(provider, "lookup_note", "")
    return note if isinstance(note, str) and note else NO_LOOKUP_NOTE
