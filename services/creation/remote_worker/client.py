"""WorkerService's client side: every call's idempotency key (and a claim's token) is made
and kept before the call is sent, and a call whose answer was lost (the connection
dropped, the deadline passed) is sent again with the same key and the same request, so the
server answers it once. A refusal with a stable reason is raised as :class:`Refused`."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atelier.creation.v1 import worker_service_pb2 as pb
from atelier.creation.v1 import worker_service_pb2_grpc
from services.kit.grpc_client import RemoteFailure
from services.kit.logging import get_logger
from services.kit.sizes import byte_size
from services.kit.timestamps import to_timestamp

log = get_logger(__name__)

T = TypeVar("T")

# Statuses after which the server may or may not have acted: send the same call again.
_RESEND = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
CALL_TIMEOUT_SECONDS = 10.0
RESENDS = 8
RESEND_PAUSE_SECONDS = 0.2

# Fault injection for tests: the client throws away the answer of its first claim that
# got a job, as if the connection dropped, and replays the claim.
DROP_FIRST_CLAIM = "drop_first_claim"
FAULTS = ("", DROP_FIRST_CLAIM)


class InputTooLarge(Exception):
    """The job's input is larger than this worker reads."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the input is larger than {byte_size(max_bytes)}")


class Refused(Exception):
    """The server refused the call with a stable reason."""

    def __init__(self, code: grpc.StatusCode, reason: str, details: str) -> None:
        super().__init__(f"{code.name} {reason}: {details}")
        self.code = code
        self.reason = reason


def reason_of(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal (the status code's name without one)."""
    return RemoteFailure.of(error).reason


def new_key() -> str:
    return str(uuid.uuid4())


def sent_now() -> timestamp_pb2.Timestamp:
    """A request's request_time: set once with its key, resent unchanged with it."""
    return to_timestamp(datetime.now(UTC))


def new_claim_token() -> str:
    """256 random bits, as the protocol asks."""
    return secrets.token_hex(32)


@dataclass
class Lease:
    """The worker's hold on one job and the version it last saw."""

    job_id: str
    claim_token: str
    lease_generation: int
    version: int

    def saw(self, version: int) -> None:
        """Versions only grow: an answer that arrives late never moves it back."""
        self.version = max(self.version, version)

    def ref(self) -> pb.LeaseRef:
        return pb.LeaseRef(
            job_id=self.job_id,
            claim_token=self.claim_token,
            lease_generation=self.lease_generation,
        )


class WorkerClient:
    def __init__(
        self,
        address: str,
        credential: str,
        worker_id: str,
        fault: str = "",
        lease_seconds: float = 0.0,
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        """``tls``: dial TLS with these credentials; None: plaintext (the settings allow
        it only where they were told to)."""
        self.worker_id = worker_id
        self.address = address
        self._lease_seconds = lease_seconds
        self._channel = (
            grpc.aio.secure_channel(address, tls)
            if tls is not None
            else grpc.aio.insecure_channel(address)
        )
        self._stub = worker_service_pb2_grpc.WorkerServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {credential}"),)
        self._fault = fault
        self.claims_dropped = 0
        self.claim_replays = 0

    async def close(self) -> None:
        await self._channel.close(None)

    async def reach(self, within_seconds: float) -> str | None:
        """Asks the server's health once (no credential needed): None when it answered,
        else grpc's account of what failed (a TLS handshake, a refused connection)."""
        try:
            await health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(), timeout=within_seconds
            )
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details() or ''}"
        return None

    async def _send(self, call: Callable[..., Awaitable[T]], request: object) -> T:
        for attempt in range(RESENDS + 1):
            try:
                return await call(request, metadata=self._metadata, timeout=CALL_TIMEOUT_SECONDS)
            except grpc.aio.AioRpcError as error:
                if error.code() in _RESEND and attempt < RESENDS:
                    await asyncio.sleep(RESEND_PAUSE_SECONDS)
                    continue
                raise Refused(error.code(), reason_of(error), error.details() or "") from None
        raise AssertionError("unreachable")

    async def claim(self) -> tuple[pb.ClaimedJob | None, Lease | None]:
        """A due job and the lease on it, or (None, None)."""
        # Kept before sending: a replay must carry both unchanged.
        request = pb.ClaimJobRequest(
            request_id=new_key(),
            request_time=sent_now(),
            claim_token=new_claim_token(),
            worker_id=self.worker_id,
        )
        if self._lease_seconds > 0:
            request.lease_duration.FromTimedelta(timedelta(seconds=self._lease_seconds))
        answer = await self._send(self._stub.ClaimJob, request)
        if answer.HasField("job") and self._fault == DROP_FIRST_CLAIM and not self.claims_dropped:
            self.claims_dropped += 1
            log.info(
                "claim_answer_dropped", job_id=answer.job.job_id, request_id=request.request_id
            )
            replayed = await self._send(self._stub.ClaimJob, request)
            self.claim_replays += 1
            log.info(
                "claim_replayed",
                job_id=replayed.job.job_id,
                first_job_id=answer.job.job_id,
                same=replayed.job.job_id == answer.job.job_id,
            )
            answer = replayed
        if not answer.HasField("job"):
            return None, None
        job = answer.job
        return job, Lease(job.job_id, request.claim_token, job.lease_generation, job.version)

    async def heartbeat(self, lease: Lease, progress: int | None) -> pb.HeartbeatJobResponse:
        request = pb.HeartbeatJobRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            progress_percent=progress if progress is not None else 0,
            has_progress=progress is not None,
        )
        answer = await self._send(self._stub.HeartbeatJob, request)
        lease.saw(answer.version)
        return answer

    async def read_input(self, lease: Lease, max_bytes: int) -> tuple[str, bytes]:
        """The job's input (content type, bytes), streamed under the lease; read again
        from the start when the stream broke off."""
        request = pb.ReadJobInputRequest(lease=lease.ref(), worker_id=self.worker_id)

        async def read(request: pb.ReadJobInputRequest, **options: Any) -> tuple[str, bytes]:
            content_type, data = "", bytearray()
            async for message in self._stub.ReadJobInput(request, **options):
                if message.HasField("info"):
                    content_type = message.info.content_type
                    continue
                data += message.chunk
                if len(data) > max_bytes:
                    raise InputTooLarge(max_bytes)
            return content_type, bytes(data)

        return await self._send(read, request)

    async def start(self, lease: Lease, request_id: str | None, provider_version: str = "") -> None:
        """SUBMITTING (no request id; with the adapter's version) or GENERATING."""
        request = pb.StartJobRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            request_id=new_key(),
            request_time=sent_now(),
            expected_version=lease.version,
            step=pb.WORKER_STEP_GENERATING if request_id else pb.WORKER_STEP_SUBMITTING,
            provider_request_id=request_id or "",
            provider_version=provider_version,
        )
        lease.saw((await self._send(self._stub.StartJob, request)).version)

    async def prepare_outputs(
        self, lease: Lease, outputs: list[pb.OutputSpec]
    ) -> list[pb.OutputUpload]:
        request = pb.PrepareOutputsRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            request_id=new_key(),
            request_time=sent_now(),
            outputs=outputs,
        )
        return list((await self._send(self._stub.PrepareOutputs, request)).uploads)

    async def complete(
        self,
        lease: Lease,
        output_asset_ids: list[str] | None = None,
        failure: pb.WorkerFailure | None = None,
    ) -> pb.CompleteJobResponse:
        request = pb.CompleteJobRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            request_id=new_key(),
            request_time=sent_now(),
            expected_version=lease.version,
            output_asset_ids=output_asset_ids or [],
            failure=failure,
        )
        answer = await self._send(self._stub.CompleteJob, request)
        lease.saw(answer.version)
        return answer

    async def release(self, lease: Lease, delay: timedelta = timedelta(0)) -> pb.ReleaseJobResponse:
        """Hands the job back, due again after ``delay`` (its request kept)."""
        request = pb.ReleaseJobRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            request_id=new_key(),
            request_time=sent_now(),
            expected_version=lease.version,
        )
        request.delay.FromTimedelta(delay)
        answer = await self._send(self._stub.ReleaseJob, request)
        lease.saw(answer.version)
        return answer

    async def acknowledge_cancel(self, lease: Lease) -> None:
        request = pb.AcknowledgeCancelRequest(
            lease=lease.ref(),
            worker_id=self.worker_id,
            request_id=new_key(),
            request_time=sent_now(),
            expected_version=lease.version,
        )
        lease.saw((await self._send(self._stub.AcknowledgeCancel, request)).version)
