"""One job run by a remote worker: the attempt driver (``worker/driver.py``, where the
attempt's policy lives) over :class:`WorkerServicePort`, its WorkerService-client
adapter, with the lease's heartbeat beside it. Through WorkerService: stream the input
under the lease (ReadJobInput), report SUBMITTING, report the request id at once
(GENERATING), upload the outputs (one presigned PUT each, PrepareOutputs) and name them in
CompleteJob (the server checks and completes them through media before the job
succeeds); fail and hand back (ReleaseJob) likewise.

The calls that change the job take turns (one lock) and send the newest version any
answer gave; heartbeats run beside them, so a slow call never lets the lease run out. A
heartbeat refused for the lease (expired, taken) stops the attempt at once: the job is
someone else's now.

``on_point`` is called at the in-process attempt's named points, at the same places
(before_submit ahead of reporting SUBMITTING, after_submit before the request id is
reported, polling, after_upload and after_output once an output is uploaded (CompleteJob
commits them all), before_complete ahead of
CompleteJob), so the crash matrix (ATELIER_STUB_CRASH_AT) kills a remote worker at each."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import TypeVar

import httpx

from atelier.creation.v1 import worker_service_pb2 as pb
from services.creation.convert import parameters_from_proto
from services.creation.providers.base import InputImage, OutputImage, Provider, ProviderError
from services.creation.providers.limits import ProviderLimits
from services.creation.remote.errors import Reason
from services.creation.remote_worker.client import Lease, Refused, WorkerClient
from services.creation.worker.context import Drain, PointHook, no_point
from services.creation.worker.driver import AttemptDriver, AttemptJob, HandedBack, PollPolicy
from services.creation.worker.outcomes import AttemptFailed, CancelAsked
from services.kit.logging import get_logger

log = get_logger(__name__)
T = TypeVar("T")

LEASE_REASONS = {
    Reason.LEASE_EXPIRED,
    Reason.LEASE_TOKEN_INVALID,
    Reason.LEASE_GENERATION_STALE,
    Reason.LEASE_POOL_MISMATCH,
}
# ReadJobInput's answer when media cannot read the input: no attempt will.
INPUT_ASSET_NOT_FOUND = "INPUT_ASSET_NOT_FOUND"
MAX_INPUT_BYTES = 20 * 1024 * 1024
# The longest hand-back delay ReleaseJob takes.
LONGEST_RELEASE_DELAY = timedelta(hours=1)


class RemoteAttempt:
    def __init__(
        self,
        job: pb.ClaimedJob,
        lease: Lease,
        client: WorkerClient,
        providers: Mapping[str, Provider],
        http: httpx.AsyncClient,
        drain: Drain,
        policy: PollPolicy,
        on_point: PointHook = no_point,
    ) -> None:
        self._job = job
        self.port = WorkerServicePort(job, lease, client, http, on_point)
        self.driver = AttemptDriver(
            attempt_job(job),
            self.port,
            providers.get(job.provider_code),
            drain=drain,
            policy=policy,
            # The server caps this pool's claims; nothing here limits a provider.
            limits=ProviderLimits(),
            on_point=on_point,
        )
        self._lost = False
        self._work: asyncio.Task[str] | None = None

    async def run(self) -> str:
        job = self._job
        beats = asyncio.create_task(self._beat(), name=f"beat:{job.job_id}")
        work = asyncio.create_task(self.driver.run(), name=f"remote-attempt:{job.job_id}")
        self._work = work
        try:
            outcome = await work
        except asyncio.CancelledError:
            if not self._lost:
                raise
            outcome = "lease_lost"
        except Refused as refused:
            outcome = (
                "lease_lost" if refused.reason in LEASE_REASONS else f"refused:{refused.reason}"
            )
            log.warning("remote_attempt_refused", job_id=job.job_id, reason=refused.reason)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        log.info("attempt_ended", job_id=job.job_id, attempt=job.attempt, outcome=outcome)
        return outcome

    async def _beat(self) -> None:
        interval = max(0.1, self._job.heartbeat_interval.ToTimedelta().total_seconds())
        while True:
            await asyncio.sleep(interval)
            try:
                await self.port.heartbeat()
            except Refused as refused:
                if refused.reason in LEASE_REASONS:
                    log.warning("lease_lost", job_id=self._job.job_id, reason=refused.reason)
                    self._lost = True
                    if self._work is not None:
                        self._work.cancel()
                    return
                log.warning("heartbeat_refused", job_id=self._job.job_id, reason=refused.reason)


def attempt_job(job: pb.ClaimedJob) -> AttemptJob:
    sent = parameters_from_proto(job.parameters)
    parameters = {name: value for name, value in sent.items() if value is not None}
    return AttemptJob(
        job,
        job.submit_key,
        parameters,
        job.provider_request_id or None,
        has_input=not job.no_input_image,
    )


class WorkerServicePort:
    """The driver's port in a remote worker: each step one WorkerService call under the
    claim's lease (the client sends a call whose answer was lost again, same key)."""

    def __init__(
        self,
        job: pb.ClaimedJob,
        lease: Lease,
        client: WorkerClient,
        http: httpx.AsyncClient,
        on_point: PointHook = no_point,
    ) -> None:
        self._job = job
        self._lease = lease
        self._client = client
        self._http = http
        self._on_point = on_point
        self._turn = asyncio.Lock()
        self._cancel = asyncio.Event()
        if job.cancel_requested:
            self._cancel.set()
        self._progress: int | None = None

    @property
    def cancel_requested(self) -> asyncio.Event:
        return self._cancel

    async def heartbeat(self) -> None:
        # Never behind a slow call that changes the job: the lease must not run out
        # while CompleteJob lands outputs. Versions only grow, so the newest answer wins
        # whichever call it came from.
        progress, self._progress = self._progress, None
        answer = await self._client.heartbeat(self._lease, progress)
        if answer.cancel_requested:
            self._cancel.set()

    async def _call(self, call: Callable[[], Awaitable[T]], *, cancelling: bool = False) -> T:
        """A call that changes the job; a version that moved (most often the owner's
        cancel) is learnt from a heartbeat, then the call is made again or (unless it is
        the cancel's own acknowledgement) the attempt stops for the cancel."""
        for _ in range(3):
            async with self._turn:
                try:
                    return await call()
                except Refused as refused:
                    if refused.reason != Reason.JOB_VERSION_MISMATCH:
                        raise
            await self.heartbeat()
            if self._cancel.is_set() and not cancelling:
                raise CancelAsked()
        raise RuntimeError("the job's version kept moving")

    async def read_input(self) -> InputImage:
        try:
            content_type, data = await self._call(
                lambda: self._client.read_input(self._lease, MAX_INPUT_BYTES)
            )
        except Refused as refused:
            if refused.reason != INPUT_ASSET_NOT_FOUND:
                raise
            raise AttemptFailed("INPUT_UNREADABLE", str(refused), retryable=False) from None
        return InputImage(data, content_type)

    async def input_url(self) -> str | None:
        return None  # the input is streamed to this worker: it goes inline

    async def mark_submitting(self, provider_version: str) -> None:
        await self._call(lambda: self._client.start(self._lease, None, provider_version))

    async def record_request(self, request_id: str) -> None:
        await self._call(lambda: self._client.start(self._lease, request_id))

    def report_progress(self, percent: int) -> None:
        self._progress = percent  # the next heartbeat carries it

    async def land_outputs(self, outputs: Sequence[OutputImage]) -> list[str] | None:
        specs = [
            pb.OutputSpec(
                content_type=o.content_type,
                size_bytes=len(o.data),
                sha256=hashlib.sha256(o.data).hexdigest(),
            )
            for o in outputs
        ]
        uploads = await self._refusing_outputs(
            lambda: self._client.prepare_outputs(self._lease, specs)
        )
        for output, upload in zip(outputs, uploads, strict=True):
            if upload.upload_url:  # empty: a replay found it complete already
                await self._upload(output, upload)
                self._on_point("after_upload")
            self._on_point("after_output")
        return [upload.asset_id for upload in uploads]

    async def _upload(self, output: OutputImage, upload: pb.OutputUpload) -> None:
        """PUTs an output's bytes with exactly the headers the presigned URL asks for.
        A 412 says the object is there already (an earlier PUT of this attempt whose
        answer was lost): the server checks it either way."""
        response = await self._http.request(
            upload.upload_method or "PUT",
            upload.upload_url,
            headers=dict(upload.upload_headers),
            content=output.data,
        )
        if response.status_code != 412:
            response.raise_for_status()

    async def complete(self, asset_ids: list[str]) -> str | None:
        answer = await self._refusing_outputs(lambda: self._client.complete(self._lease, asset_ids))
        return _OUTCOME_NAMES.get(answer.outcome, "unknown")

    async def _refusing_outputs(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call``, its refusal of an output (the server checks each) a failure of the
        attempt, for a retry."""
        try:
            return await self._call(call)
        except Refused as refused:
            if refused.reason != Reason.OUTPUT_REJECTED:
                raise
            raise AttemptFailed("OUTPUT_REJECTED", str(refused), retryable=True) from None

    async def fail(self, failure: AttemptFailed) -> str:
        """The server backs off the retry (never sooner than ``retry_after``)."""
        sent = pb.WorkerFailure(
            code=failure.code, message=failure.message[:2000], retryable=failure.retryable
        )
        if failure.retry_after_seconds is not None:
            sent.retry_after.FromTimedelta(timedelta(seconds=int(failure.retry_after_seconds)))
        return await self._complete_failed(sent)

    async def mark_outcome_unknown(self, error: ProviderError) -> str:
        sent = pb.WorkerFailure(
            code=error.code, message=error.message[:2000], retryable=False, outcome_unknown=True
        )
        return await self._complete_failed(sent)

    async def _complete_failed(self, failure: pb.WorkerFailure) -> str:
        answer = await self._call(lambda: self._client.complete(self._lease, failure=failure))
        return _OUTCOME_NAMES.get(answer.outcome, "unknown")

    async def hand_back(self, delay: timedelta) -> HandedBack:
        delay = min(delay, LONGEST_RELEASE_DELAY)
        answer = await self._call(lambda: self._client.release(self._lease, delay))
        if answer.outcome == pb.WORKER_JOB_OUTCOME_QUEUED:
            return HandedBack.QUEUED
        return HandedBack.CANCELLED  # the owner had asked: the server cancelled it

    async def acknowledge_cancel(self) -> str:
        await self._call(lambda: self._client.acknowledge_cancel(self._lease), cancelling=True)
        return "cancelled"


_OUTCOME_NAMES = {
    pb.WORKER_JOB_OUTCOME_SUCCEEDED: "succeeded",
    pb.WORKER_JOB_OUTCOME_QUEUED: "retrying",
    pb.WORKER_JOB_OUTCOME_FAILED: "failed",
    pb.WORKER_JOB_OUTCOME_CANCELLED: "cancelled",
    pb.WORKER_JOB_OUTCOME_NEEDS_ATTENTION: "outcome_unknown",
}
