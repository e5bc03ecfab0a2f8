"""The reference remote worker's attempt (the attempt driver over its WorkerService
adapter), against a fake WorkerService client, a mocked HTTP transport and a scripted
provider; each job resumes a request, so the attempt starts at its first poll.

Outputs: each declared by type, size and SHA-256, PUT to its URL with exactly the headers
given, then named in CompleteJob in order; an output the server rejects fails the attempt.

Polls, as the in-process worker's (one driver): a poll error that says when to ask again
(a 429's Retry-After) is never asked sooner; a wait longer than a provider slot's hands
the job back (ReleaseJob) due after it; errors that keep coming hand it back after the
driver's count, with the backoff as its delay."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from datetime import timedelta
from itertools import pairwise

import grpc
import httpx

from atelier.creation.v1 import worker_service_pb2 as pb
from services.creation.providers.base import Done, OutputImage, PollResult, ProviderError
from services.creation.remote_worker.attempt import RemoteAttempt
from services.creation.remote_worker.client import Lease, Refused
from services.creation.worker.context import Drain
from services.creation.worker.driver import (
    LONGEST_POLL_PAUSE,
    POLL_ERRORS_BEFORE_HAND_BACK,
    PollPolicy,
)

OUTPUTS = [OutputImage(b"first", "image/png", 1, 1), OutputImage(b"second!", "image/webp", 1, 1)]
# A poll period and a backoff far shorter than any Retry-After below.
QUICK = PollPolicy(0.01, 0.001, 0.001)


class FakeClient:
    def __init__(self, reject: bool = False) -> None:
        self.declared: list[pb.OutputSpec] = []
        self.completed: list[list[str]] = []
        self.failures: list[pb.WorkerFailure] = []
        self.released: list[timedelta] = []
        self._reject = reject

    async def heartbeat(self, lease: Lease, progress: int | None) -> pb.HeartbeatJobResponse:
        return pb.HeartbeatJobResponse(version=lease.version)

    async def prepare_outputs(
        self, lease: Lease, outputs: list[pb.OutputSpec]
    ) -> list[pb.OutputUpload]:
        self.declared = outputs
        return [
            pb.OutputUpload(
                asset_id=f"asset-{i}",
                upload_url=f"https://storage.test/put/{i}",
                upload_method="PUT",
                upload_headers={"content-type": o.content_type, "x-sig": f"s{i}"},
            )
            for i, o in enumerate(outputs)
        ]

    async def complete(
        self,
        lease: Lease,
        output_asset_ids: list[str] | None = None,
        failure: pb.WorkerFailure | None = None,
    ) -> pb.CompleteJobResponse:
        if failure is not None:
            self.failures.append(failure)
            return pb.CompleteJobResponse(version=9, outcome=pb.WORKER_JOB_OUTCOME_QUEUED)
        self.completed.append(list(output_asset_ids or []))
        if self._reject:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "OUTPUT_REJECTED", "no")
        return pb.CompleteJobResponse(version=9, outcome=pb.WORKER_JOB_OUTCOME_SUCCEEDED)

    async def release(self, lease: Lease, delay: timedelta = timedelta(0)) -> pb.ReleaseJobResponse:
        self.released.append(delay)
        return pb.ReleaseJobResponse(version=6, outcome=pb.WORKER_JOB_OUTCOME_QUEUED)


class Scripted:
    """Answers its first ``errors`` polls with a retryable error (naming ``retry_after``
    when given), then ``outputs``; notes when each poll came."""

    code = "stub"
    version = "test"
    supports_idempotent_submit = False

    def __init__(
        self,
        errors: int = 0,
        retry_after: float | None = None,
        outputs: Sequence[OutputImage] = OUTPUTS,
    ) -> None:
        self.errors = errors
        self.retry_after = retry_after
        self.outputs = outputs
        self.polled_at: list[float] = []

    async def poll(self, request_id: str) -> PollResult:
        self.polled_at.append(asyncio.get_running_loop().time())
        if len(self.polled_at) <= self.errors:
            raise ProviderError(
                "RATE_LIMITED", "slow down", retryable=True, retry_after_seconds=self.retry_after
            )
        return Done(self.outputs)


async def run(
    client: FakeClient,
    provider: Scripted,
    policy: PollPolicy = QUICK,
    storage: httpx.MockTransport | None = None,
) -> str:
    job = pb.ClaimedJob(
        job_id="j1",
        lease_generation=1,
        version=5,
        attempt=1,
        num_outputs=len(provider.outputs),
        provider_code="stub",
        provider_request_id="req-1",
    )
    storage = storage or httpx.MockTransport(lambda request: httpx.Response(200))
    async with httpx.AsyncClient(transport=storage) as http:
        attempt = RemoteAttempt(
            job,
            Lease("j1", "t" * 64, 1, 5),
            client,  # type: ignore[arg-type]
            {"stub": provider},  # type: ignore[dict-item]
            http,
            Drain(),
            policy,
        )
        return await attempt.run()


async def test_outputs_are_declared_put_with_their_headers_and_named_in_order() -> None:
    puts: list[httpx.Request] = []

    def storage(request: httpx.Request) -> httpx.Response:
        puts.append(request)
        return httpx.Response(200)

    client = FakeClient()
    outcome = await run(client, Scripted(), storage=httpx.MockTransport(storage))
    assert outcome == "succeeded"
    assert [(s.content_type, s.size_bytes, s.sha256) for s in client.declared] == [
        (o.content_type, len(o.data), hashlib.sha256(o.data).hexdigest()) for o in OUTPUTS
    ]
    assert [(r.method, str(r.url), r.headers["x-sig"], r.content) for r in puts] == [
        ("PUT", "https://storage.test/put/0", "s0", b"first"),
        ("PUT", "https://storage.test/put/1", "s1", b"second!"),
    ]
    assert client.completed == [["asset-0", "asset-1"]]


async def test_a_rejected_output_fails_the_attempt_for_a_retry() -> None:
    client = FakeClient(reject=True)
    assert await run(client, Scripted()) == "retrying"
    [failure] = client.failures
    assert (failure.code, failure.retryable) == ("OUTPUT_REJECTED", True)


async def test_a_poll_is_never_sooner_than_the_provider_asked() -> None:
    provider = Scripted(errors=2, retry_after=0.3)
    client = FakeClient()
    assert await run(client, provider) == "succeeded"
    assert client.completed == [["asset-0", "asset-1"]]
    assert len(provider.polled_at) == 3
    assert all(later - earlier >= 0.3 for earlier, later in pairwise(provider.polled_at))


async def test_a_wait_longer_than_a_slot_takes_hands_the_job_back_due_after_it() -> None:
    retry_after = LONGEST_POLL_PAUSE.total_seconds() * 2
    provider = Scripted(errors=1, retry_after=retry_after)
    client = FakeClient()
    assert await run(client, provider) == "handed_back"
    assert len(provider.polled_at) == 1  # not asked again meanwhile
    assert client.released == [timedelta(seconds=retry_after)]


async def test_errors_that_keep_coming_hand_the_job_back_with_the_backoff() -> None:
    provider = Scripted(errors=POLL_ERRORS_BEFORE_HAND_BACK)
    client = FakeClient()
    assert await run(client, provider, PollPolicy(0.01, 0.01, 0.02)) == "handed_back"
    assert len(provider.polled_at) == POLL_ERRORS_BEFORE_HAND_BACK
    [delay] = client.released
    assert timedelta(0) <= delay <= timedelta(seconds=0.02)
