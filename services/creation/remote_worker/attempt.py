"""One job run by a remote worker, in DESIGN.md's order, through WorkerService: stream the
input under the lease (ReadJobInput), report SUBMITTING, submit, report the request id at
once (GENERATING), poll while a heartbeat keeps the lease, then upload the outputs (one
presigned PUT each, PrepareOutputs) and name them in CompleteJob (the server checks and
completes them through media before the job succeeds). A job that already has a
request resumes polling and never submits.

The calls that change the job take turns (one lock) and send the newest version any
answer gave; heartbeats run beside them, so a slow call never lets the lease run out. A
heartbeat refused for the lease (expired, taken) stops the attempt at once: the job is
someone else's now.

``on_point`` is called at the in-process attempt's named points, at the same places
(before_submit ahead of reporting SUBMITTING, after_submit before the request id is
reported, polling, after_output once an output is uploaded, before_complete ahead of
CompleteJob), so the crash matrix (ATELIER_STUB_CRASH_AT) kills a remote worker at each."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import httpx
from google.protobuf import duration_pb2

from atelier.creation.v1 import worker_service_pb2 as pb
from services.creation.convert import parameters_from_proto
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
from services.creation.remote.errors import Reason
from services.creation.remote_worker.client import Lease, Refused, WorkerClient
from services.creation.worker.context import PointHook, no_point
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
POLL_ERRORS_BEFORE_RELEASE = 5
PROVIDER_CANCEL_TIMEOUT_SECONDS = 10.0
MAX_INPUT_BYTES = 20 * 1024 * 1024


class _Cancel(Exception):
    """The owner asked to cancel: stop at this safe point."""


class RemoteDrain:
    """``asked``: nothing new reaches a provider; ``due``: polling attempts hand back."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.due = asyncio.Event()


class RemoteAttempt:
    def __init__(
        self,
        job: pb.ClaimedJob,
        lease: Lease,
        client: WorkerClient,
        providers: Mapping[str, Provider],
        http: httpx.AsyncClient,
        drain: RemoteDrain,
        provider_poll_seconds: float,
        on_point: PointHook = no_point,
    ) -> None:
        self._job = job
        self._on_point = on_point
        self._lease = lease
        self._client = client
        self._providers = providers
        self._http = http
        self._drain = drain
        self._poll_seconds = provider_poll_seconds
        self._turn = asyncio.Lock()
        self._cancel = asyncio.Event()
        if job.cancel_requested:
            self._cancel.set()
        self._progress: int | None = None
        self._lost = False
        self._work: asyncio.Task[str] | None = None

    async def run(self) -> str:
        job = self._job
        beats = asyncio.create_task(self._beat(), name=f"beat:{job.job_id}")
        work = asyncio.create_task(self._run(), name=f"remote-attempt:{job.job_id}")
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

    # --- the lease --------------------------------------------------------------------

    async def _beat(self) -> None:
        interval = max(0.1, self._job.heartbeat_interval.ToTimedelta().total_seconds())
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat()
            except Refused as refused:
                if refused.reason in LEASE_REASONS:
                    log.warning("lease_lost", job_id=self._job.job_id, reason=refused.reason)
                    self._lost = True
                    if self._work is not None:
                        self._work.cancel()
                    return
                log.warning("heartbeat_refused", job_id=self._job.job_id, reason=refused.reason)

    async def _heartbeat(self) -> None:
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
            await self._heartbeat()
            if self._cancel.is_set() and not cancelling:
                raise _Cancel()
        raise RuntimeError("the job's version kept moving")

    # --- the work ---------------------------------------------------------------------

    async def _run(self) -> str:
        job = self._job
        provider = self._providers.get(job.provider_code)
        if provider is None:
            return await self._fail("PROVIDER_NOT_CONFIGURED", "no adapter here", retryable=False)
        request_id = job.provider_request_id or None
        try:
            if request_id is None:
                if self._cancel.is_set():
                    raise _Cancel()
                if self._drain.asked.is_set():
                    return await self._release()
                try:
                    image = await self._read_input()
                except Refused as refused:
                    if refused.reason != INPUT_ASSET_NOT_FOUND:
                        raise
                    return await self._fail("INPUT_UNREADABLE", str(refused), retryable=False)
                submitted = await self._submit(provider, image)
                if isinstance(submitted, str) and submitted.startswith("outcome:"):
                    return submitted.removeprefix("outcome:")
                request_id = submitted
            return await self._poll(provider, request_id)
        except _Cancel:
            return await self._cancelled(provider, request_id)

    async def _read_input(self) -> InputImage:
        content_type, data = await self._call(
            lambda: self._client.read_input(self._lease, MAX_INPUT_BYTES)
        )
        return InputImage(data, content_type)

    async def _submit(self, provider: Provider, image: InputImage) -> str:
        job = self._job
        request = GenerationRequest(
            job_id=job.job_id,
            attempt=job.attempt,
            provider_model=job.provider_model,
            style_id=job.style_id,
            prompt=job.prompt,
            negative_prompt=job.negative_prompt,
            width=job.width,
            height=job.height,
            input_image=image,
            parameters=parameters_from_proto(job.parameters),
            num_outputs=job.num_outputs,
        )
        self._on_point("before_submit")  # before SUBMITTING is reported, as in-process
        await self._call(lambda: self._client.start(self._lease, None, provider.version))
        try:
            request_id = await provider.submit(request, job.submit_key)
        except ProviderError as error:
            if error.outcome_unknown and not provider.supports_idempotent_submit:
                return "outcome:" + await self._fail(
                    error.code, error.message, retryable=False, outcome_unknown=True
                )
            return "outcome:" + await self._fail(
                error.code,
                error.message,
                retryable=is_retryable(error.code, error.retryable),
                retry_after=error.retry_after_seconds,
            )
        self._on_point("after_submit")
        await self._call(lambda: self._client.start(self._lease, request_id))
        return request_id

    async def _poll(self, provider: Provider, request_id: str) -> str:
        errors = 0
        while True:
            self._on_point("polling")
            if self._cancel.is_set():
                raise _Cancel()
            if self._drain.due.is_set():
                return await self._release()
            try:
                result = await provider.poll(request_id)
            except ProviderError as error:
                if not is_retryable(error.code, error.retryable):
                    return await self._fail(error.code, error.message, retryable=False)
                errors += 1
                if errors >= POLL_ERRORS_BEFORE_RELEASE:
                    return await self._release()
                await self._pause(self._poll_seconds * errors)
                continue
            errors = 0
            if isinstance(result, Done):
                return await self._complete(result.outputs)
            if isinstance(result, Failed):
                return await self._fail(
                    result.code,
                    result.message,
                    retryable=is_retryable(result.code, result.retryable),
                )
            if isinstance(result, Running):
                self._progress = max(0, min(100, result.progress))
            await self._pause(self._poll_seconds)

    async def _pause(self, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(self._cancel.wait()),
            asyncio.ensure_future(self._drain.due.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # --- endings ----------------------------------------------------------------------

    async def _complete(self, outputs: Sequence[OutputImage]) -> str:
        job = self._job
        if len(outputs) < job.num_outputs:
            return await self._fail(
                "NO_OUTPUT", f"the provider returned {len(outputs)} images", retryable=True
            )
        made = outputs[: job.num_outputs]
        specs = [
            pb.OutputSpec(
                content_type=o.content_type,
                size_bytes=len(o.data),
                sha256=hashlib.sha256(o.data).hexdigest(),
            )
            for o in made
        ]
        try:
            uploads = await self._call(lambda: self._client.prepare_outputs(self._lease, specs))
            for output, upload in zip(made, uploads, strict=True):
                if upload.upload_url:  # empty: a replay found it complete already
                    await self._upload(output, upload)
                self._on_point("after_output")
            self._on_point("before_complete")
            ids = [upload.asset_id for upload in uploads]
            answer = await self._call(lambda: self._client.complete(self._lease, ids))
        except Refused as refused:
            if refused.reason != Reason.OUTPUT_REJECTED:
                raise
            return await self._fail("OUTPUT_REJECTED", str(refused), retryable=True)
        return _OUTCOME_NAMES.get(answer.outcome, "unknown")

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

    async def _fail(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        outcome_unknown: bool = False,
        retry_after: float | None = None,
    ) -> str:
        failure = pb.WorkerFailure(
            code=code, message=message[:2000], retryable=retryable, outcome_unknown=outcome_unknown
        )
        if retry_after is not None:
            failure.retry_after.CopyFrom(duration_pb2.Duration(seconds=int(retry_after)))
        answer = await self._call(lambda: self._client.complete(self._lease, failure=failure))
        return _OUTCOME_NAMES.get(answer.outcome, "unknown")

    async def _release(self) -> str:
        answer = await self._call(lambda: self._client.release(self._lease))
        return "handed_back" if answer.outcome == pb.WORKER_JOB_OUTCOME_QUEUED else "cancelled"

    async def _cancelled(self, provider: Provider | None, request_id: str | None) -> str:
        if provider is not None and request_id is not None:
            try:
                await asyncio.wait_for(provider.cancel(request_id), PROVIDER_CANCEL_TIMEOUT_SECONDS)
            except (ProviderError, TimeoutError) as error:
                log.warning("provider_cancel_failed", job_id=self._job.job_id, error=str(error))
        await self._call(lambda: self._client.acknowledge_cancel(self._lease), cancelling=True)
        return "cancelled"


_OUTCOME_NAMES = {
    pb.WORKER_JOB_OUTCOME_SUCCEEDED: "succeeded",
    pb.WORKER_JOB_OUTCOME_QUEUED: "retrying",
    pb.WORKER_JOB_OUTCOME_FAILED: "failed",
    pb.WORKER_JOB_OUTCOME_CANCELLED: "cancelled",
    pb.WORKER_JOB_OUTCOME_NEEDS_ATTENTION: "outcome_unknown",
}
