"""The reference remote worker's output path, against a fake WorkerService client and a
mocked HTTP transport: each output declared by type, size and SHA-256, PUT to its URL with
exactly the headers given, then named in CompleteJob in order; an output the server
rejects fails the attempt."""

from __future__ import annotations

import hashlib

import grpc
import httpx

from atelier.creation.v1 import worker_service_pb2 as pb
from services.creation.providers.base import OutputImage
from services.creation.remote_worker.attempt import RemoteAttempt, RemoteDrain
from services.creation.remote_worker.client import Lease, Refused

OUTPUTS = [OutputImage(b"first", "image/png", 1, 1), OutputImage(b"second!", "image/webp", 1, 1)]


class FakeClient:
    def __init__(self, reject: bool = False) -> None:
        self.declared: list[pb.OutputSpec] = []
        self.completed: list[list[str]] = []
        self.failures: list[pb.WorkerFailure] = []
        self._reject = reject

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


def attempt(client: FakeClient, http: httpx.AsyncClient) -> RemoteAttempt:
    job = pb.ClaimedJob(job_id="j1", lease_generation=1, version=5, attempt=1, num_outputs=2)
    lease = Lease("j1", "t" * 64, 1, 5)
    return RemoteAttempt(job, lease, client, {}, http, RemoteDrain(), 0.01)  # type: ignore[arg-type]


async def test_outputs_are_declared_put_with_their_headers_and_named_in_order() -> None:
    puts: list[httpx.Request] = []

    def storage(request: httpx.Request) -> httpx.Response:
        puts.append(request)
        return httpx.Response(200)

    client = FakeClient()
    async with httpx.AsyncClient(transport=httpx.MockTransport(storage)) as http:
        outcome = await attempt(client, http)._complete(OUTPUTS)
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
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    async with httpx.AsyncClient(transport=transport) as http:
        outcome = await attempt(client, http)._complete(OUTPUTS)
    assert outcome == "retrying"
    [failure] = client.failures
    assert (failure.code, failure.retryable) == ("OUTPUT_REJECTED", True)
