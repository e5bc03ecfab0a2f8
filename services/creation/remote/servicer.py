"""WorkerService (internal listener, a worker pool's credential): checks each request's
shape, then hands it to the remote jobs layer. Answers of keyed calls are stored as the
response message's bytes, so a replay is byte for byte the first answer."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2
from grpc import aio

from atelier.creation.v1 import worker_service_pb2 as pb
from atelier.creation.v1 import worker_service_pb2_grpc
from services.creation import convert, submission
from services.creation.domain import Job, Status
from services.creation.media_client import OutputUpload
from services.creation.remote.errors import Reason
from services.creation.remote.service import (
    CallKey,
    Failure,
    LeaseClaim,
    OutputSpec,
    RemoteJobs,
)
from services.kit.auth import current_principal, principal_id_problem
from services.kit.client_times import client_time
from services.kit.clock import Clock
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.ids import is_uuid
from services.kit.timestamps import set_timestamp, to_timestamp

Context = aio.ServicerContext[Any, Any]

_TOKEN = re.compile(r"[0-9a-f]{64}")
MAX_KEY = 200
MAX_TEXT = 2000
_OUTCOMES: dict[Status, pb.WorkerJobOutcome.ValueType] = {
    Status.SUCCEEDED: pb.WORKER_JOB_OUTCOME_SUCCEEDED,
    Status.QUEUED: pb.WORKER_JOB_OUTCOME_QUEUED,
    Status.FAILED: pb.WORKER_JOB_OUTCOME_FAILED,
    Status.CANCELLED: pb.WORKER_JOB_OUTCOME_CANCELLED,
    Status.NEEDS_ATTENTION: pb.WORKER_JOB_OUTCOME_NEEDS_ATTENTION,
}


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromTimedelta(timedelta(seconds=seconds))
    return duration


def _check(problems: list[FieldViolation]) -> None:
    if problems:
        raise invalid_argument(Reason.INVALID_WORKER_REQUEST, problems)


def _key(value: str, problems: list[FieldViolation]) -> str:
    if not 0 < len(value) <= MAX_KEY or submission.has_control_characters(value):
        problems.append(FieldViolation("request_id", f"must be 1-{MAX_KEY} printable characters"))
    return value


def _token(name: str, value: str, problems: list[FieldViolation]) -> str:
    if not _TOKEN.fullmatch(value):
        problems.append(FieldViolation(name, "must be 64 lowercase hex digits (256 bits)"))
    return value


def _worker(value: str, problems: list[FieldViolation]) -> str:
    problem = principal_id_problem(value)
    if problem is not None:
        problems.append(FieldViolation("worker_id", problem))
    return value


def _pool() -> str:
    return current_principal().worker_pool


def _lease(lease: pb.LeaseRef, worker_id: str, problems: list[FieldViolation]) -> LeaseClaim:
    if not is_uuid(lease.job_id):
        problems.append(FieldViolation("lease.job_id", "must be a UUID"))
    _token("lease.claim_token", lease.claim_token, problems)
    if lease.lease_generation < 1:
        problems.append(FieldViolation("lease.lease_generation", "must be at least 1"))
    _worker(worker_id, problems)
    return LeaseClaim(
        _pool(), worker_id, lease.job_id.lower(), lease.claim_token, lease.lease_generation
    )


def _sent_at(request: Any, now: datetime, problems: list[FieldViolation]) -> datetime | None:
    """The request's request_time (when the worker first sent it), if set."""
    if not request.HasField("request_time"):
        return None
    return client_time("request_time", request.request_time, now, problems)


def _call_key(
    method: str, request_id: str, request: Any, now: datetime, problems: list[FieldViolation]
) -> CallKey:
    _key(request_id, problems)
    digest = hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
    return CallKey(request_id, method, digest, _sent_at(request, now, problems))


def _output_spec(index: int, spec: pb.OutputSpec, problems: list[FieldViolation]) -> OutputSpec:
    """Shapes only; media judges the type and size it accepts (OUTPUT_REJECTED)."""
    where = f"outputs[{index}]"
    if not 0 < len(spec.content_type) <= MAX_KEY:
        problems.append(FieldViolation(f"{where}.content_type", "must be an image MIME type"))
    if spec.size_bytes < 1:
        problems.append(FieldViolation(f"{where}.size_bytes", "must be the size in bytes"))
    if not _TOKEN.fullmatch(spec.sha256):
        problems.append(FieldViolation(f"{where}.sha256", "must be 64 lowercase hex digits"))
    return OutputSpec(spec.content_type, spec.size_bytes, spec.sha256)


def _expected(value: int, problems: list[FieldViolation]) -> int:
    if value < 1:
        problems.append(FieldViolation("expected_version", "must be at least 1"))
    return value


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(self, jobs: RemoteJobs, clock: Clock) -> None:
        self._jobs = jobs
        self._clock = clock

    def _claimed(self, job: Job) -> pb.ClaimedJob:
        claimed = pb.ClaimedJob(
            job_id=job.job_id,
            lease_generation=job.lease_epoch,
            version=job.version,
            attempt=job.attempt,
            provider_code=job.provider_code,
            provider_model=job.provider_model,
            style_id=job.style_id,
            prompt=job.prompt,
            negative_prompt=job.negative_prompt,
            width=job.width,
            height=job.height,
            num_outputs=job.num_outputs,
            provider_request_id=job.provider_request_id or "",
            cancel_requested=job.cancel_requested,
            heartbeat_interval=_duration(self._jobs.heartbeat_seconds(job)),
            submit_key=f"{job.job_id}:{job.attempt}",
            no_input_image=job.input_asset_id is None,
        )
        convert.fill_parameters(claimed.parameters, job.parameters)
        if job.lease_expires_at is not None:
            set_timestamp(claimed.lease_expire_time, job.lease_expires_at)
        return claimed

    async def ClaimJob(self, request: pb.ClaimJobRequest, context: Context) -> pb.ClaimJobResponse:
        problems: list[FieldViolation] = []
        _key(request.request_id, problems)
        _token("claim_token", request.claim_token, problems)
        _worker(request.worker_id, problems)
        asked = request.lease_duration.ToTimedelta().total_seconds()
        if not 0 <= asked <= 86400:
            problems.append(FieldViolation("lease_duration", "must be between 0 and 1 day"))
        sent_at = _sent_at(request, self._clock(), problems)
        _check(problems)
        job = await self._jobs.claim(
            _pool(), request.request_id, request.claim_token, request.worker_id, asked, sent_at
        )
        response = pb.ClaimJobResponse(server_time=to_timestamp(datetime.now(UTC)))
        if job is not None:
            response.job.CopyFrom(self._claimed(job))
        return response

    async def HeartbeatJob(
        self, request: pb.HeartbeatJobRequest, context: Context
    ) -> pb.HeartbeatJobResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        if request.has_progress and not 0 <= request.progress_percent <= 100:
            problems.append(FieldViolation("progress_percent", "must be 0-100"))
        _check(problems)
        progress = request.progress_percent if request.has_progress else None
        job, now = await self._jobs.heartbeat(claim, progress)
        response = pb.HeartbeatJobResponse(
            version=job.version,
            server_time=to_timestamp(now),
            cancel_requested=job.cancel_requested,
        )
        if job.lease_expires_at is not None:
            set_timestamp(response.lease_expire_time, job.lease_expires_at)
        return response

    async def ReadJobInput(
        self, request: pb.ReadJobInputRequest, context: Context
    ) -> AsyncIterator[pb.ReadJobInputResponse]:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        _check(problems)
        # The claim is checked before the first message: a refusal is the call's status.
        opened = await self._jobs.read_input(claim)
        yield pb.ReadJobInputResponse(
            info=pb.JobInputInfo(content_type=opened.content_type, size_bytes=opened.size_bytes)
        )
        async for chunk in opened.chunks:
            yield pb.ReadJobInputResponse(chunk=chunk)

    async def PrepareOutputs(
        self, request: pb.PrepareOutputsRequest, context: Context
    ) -> pb.PrepareOutputsResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        key = _call_key("PrepareOutputs", request.request_id, request, self._clock(), problems)
        specs = [_output_spec(i, o, problems) for i, o in enumerate(request.outputs)]
        if not specs:
            problems.append(FieldViolation("outputs", "name the outputs to upload"))
        _check(problems)

        def respond(uploads: Sequence[OutputUpload]) -> bytes:
            reply = pb.PrepareOutputsResponse()
            for upload in uploads:
                answer = reply.uploads.add(
                    asset_id=upload.asset_id,
                    upload_url=upload.url,
                    upload_method=upload.method,
                    upload_headers=upload.headers,
                )
                if upload.expires_at is not None:
                    set_timestamp(answer.expire_time, upload.expires_at)
            return reply.SerializeToString()

        answer = await self._jobs.prepare_outputs(claim, key, specs, respond)
        return pb.PrepareOutputsResponse.FromString(answer)

    async def StartJob(self, request: pb.StartJobRequest, context: Context) -> pb.StartJobResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        key = _call_key("StartJob", request.request_id, request, self._clock(), problems)
        expected = _expected(request.expected_version, problems)
        provider_request: str | None = None
        if request.step == pb.WORKER_STEP_GENERATING:
            provider_request = request.provider_request_id
            if not 0 < len(provider_request) <= MAX_KEY:
                problems.append(
                    FieldViolation(
                        "provider_request_id", f"GENERATING needs 1-{MAX_KEY} characters"
                    )
                )
        elif request.step != pb.WORKER_STEP_SUBMITTING:
            problems.append(FieldViolation("step", "must be SUBMITTING or GENERATING"))
        if len(request.provider_version) > MAX_KEY:
            problems.append(FieldViolation("provider_version", f"at most {MAX_KEY} characters"))
        _check(problems)

        def respond(job: Job) -> bytes:
            reply = pb.StartJobResponse(
                version=job.version,
                lease_generation=claim.lease_generation,
                server_time=to_timestamp(self._clock()),
            )
            if job.lease_expires_at is not None:
                set_timestamp(reply.lease_expire_time, job.lease_expires_at)
            return reply.SerializeToString()

        answer = await self._jobs.start(
            claim,
            key,
            expected,
            provider_request,
            respond,
            provider_version=request.provider_version or None,
        )
        return pb.StartJobResponse.FromString(answer)

    async def CompleteJob(
        self, request: pb.CompleteJobRequest, context: Context
    ) -> pb.CompleteJobResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        key = _call_key("CompleteJob", request.request_id, request, self._clock(), problems)
        expected = _expected(request.expected_version, problems)
        failed = request.HasField("failure")
        if failed == bool(request.output_asset_ids):
            problems.append(
                FieldViolation("output_asset_ids", "send either the outputs or a failure")
            )
        for index, asset_id in enumerate(request.output_asset_ids):
            if not is_uuid(asset_id):
                problems.append(FieldViolation(f"output_asset_ids[{index}]", "must be a UUID"))
        if failed and not 0 < len(request.failure.code) <= 100:
            problems.append(FieldViolation("failure.code", "must be 1-100 characters"))
        if len(request.failure.message) > MAX_TEXT:
            problems.append(FieldViolation("failure.message", f"at most {MAX_TEXT} characters"))
        _check(problems)

        def respond(job: Job) -> bytes:
            return pb.CompleteJobResponse(
                version=job.version,
                outcome=_OUTCOMES.get(job.status, pb.WORKER_JOB_OUTCOME_UNSPECIFIED),
                lease_generation=claim.lease_generation,
                server_time=to_timestamp(self._clock()),
            ).SerializeToString()

        if failed:
            failure = request.failure
            retry_after = (
                failure.retry_after.ToTimedelta().total_seconds()
                if failure.HasField("retry_after")
                else None
            )
            answer = await self._jobs.fail(
                claim,
                key,
                expected,
                Failure(
                    failure.code,
                    failure.message,
                    failure.retryable,
                    failure.outcome_unknown,
                    retry_after,
                ),
                respond,
            )
        else:
            answer = await self._jobs.complete(
                claim, key, expected, list(request.output_asset_ids), respond
            )
        return pb.CompleteJobResponse.FromString(answer)

    async def ReleaseJob(
        self, request: pb.ReleaseJobRequest, context: Context
    ) -> pb.ReleaseJobResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        key = _call_key("ReleaseJob", request.request_id, request, self._clock(), problems)
        expected = _expected(request.expected_version, problems)
        delay = request.delay.ToTimedelta()
        if not timedelta(0) <= delay <= timedelta(hours=1):
            problems.append(FieldViolation("delay", "must be between 0 and 1 hour"))
        _check(problems)
        answer = await self._jobs.release(
            claim,
            key,
            expected,
            delay,
            lambda job: pb.ReleaseJobResponse(
                version=job.version,
                outcome=_OUTCOMES.get(job.status, pb.WORKER_JOB_OUTCOME_UNSPECIFIED),
                lease_generation=claim.lease_generation,
                server_time=to_timestamp(self._clock()),
            ).SerializeToString(),
        )
        return pb.ReleaseJobResponse.FromString(answer)

    async def AcknowledgeCancel(
        self, request: pb.AcknowledgeCancelRequest, context: Context
    ) -> pb.AcknowledgeCancelResponse:
        problems: list[FieldViolation] = []
        claim = _lease(request.lease, request.worker_id, problems)
        key = _call_key("AcknowledgeCancel", request.request_id, request, self._clock(), problems)
        expected = _expected(request.expected_version, problems)
        _check(problems)
        answer = await self._jobs.acknowledge_cancel(
            claim,
            key,
            expected,
            lambda job: pb.AcknowledgeCancelResponse(
                version=job.version,
                lease_generation=claim.lease_generation,
                server_time=to_timestamp(self._clock()),
            ).SerializeToString(),
        )
        return pb.AcknowledgeCancelResponse.FromString(answer)
