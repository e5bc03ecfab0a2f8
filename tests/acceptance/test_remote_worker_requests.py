"""Bad remote-worker requests against a real creation: an answer listing hundreds of
malformed outputs stays a small INVALID_ARGUMENT (its reason and a capped violation list,
never a RESOURCE_EXHAUSTED that reads as retryable), and a request_time ahead of the
server's clock is refused with the window it must fall in."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import timestamp_pb2

from atelier.creation.v1 import worker_service_pb2 as pb
from atelier.creation.v1 import worker_service_pb2_grpc
from services.creation.remote_worker.client import reason_of
from services.dev.stack import Stack
from services.kit.errors import MAX_VIOLATIONS
from tests.support.remote_workers import channel, pool_metadata, pools_setting
from tests.support.rpc import bad_request
from tests.support.stacks import stack_of_its_own

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def api(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("remote-requests")
    env = {"ATELIER_ENV": "test", "ATELIER_REMOTE_POOLS": pools_setting()}
    with stack_of_its_own(postgres_admin_url, work, "api", env) as stack:
        yield stack


def some_lease() -> pb.LeaseRef:
    """A well-formed lease nobody holds: a request's shape is judged before its lease."""
    return pb.LeaseRef(
        job_id=str(uuid.uuid4()), claim_token=secrets.token_hex(32), lease_generation=1
    )


async def refusal(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def trailer_bytes(error: grpc.aio.AioRpcError) -> int:
    return sum(len(k) + len(v) for k, v in error.trailing_metadata() or ())


async def test_prepare_outputs_with_hundreds_of_bad_outputs_answers_a_capped_list(
    api: Stack,
) -> None:
    bad = pb.OutputSpec(content_type="", size_bytes=0, sha256="not-a-digest" * 20)
    request = pb.PrepareOutputsRequest(
        lease=some_lease(),
        worker_id="probe",
        request_id=str(uuid.uuid4()),
        outputs=[bad] * 150,  # three violations each: 450 in all
    )
    async with channel(api) as ch:
        stub = worker_service_pb2_grpc.WorkerServiceStub(ch)
        error = await refusal(stub.PrepareOutputs(request, metadata=pool_metadata("gpu")))
    assert (error.code(), reason_of(error)) == (INVALID, "INVALID_WORKER_REQUEST")
    found = bad_request(error)
    assert found is not None
    violations = [(v.field, v.description) for v in found.field_violations]
    assert len(violations) == MAX_VIOLATIONS + 1
    assert violations[0][0] == "outputs[0].content_type"
    hidden = 450 - MAX_VIOLATIONS
    assert violations[-1] == ("", f"and {hidden} more violations not shown")
    assert trailer_bytes(error) < 6 * 1024, "well under gRPC's 8 KiB soft metadata limit"


def stamp(when: datetime) -> timestamp_pb2.Timestamp:
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(when)
    return value


def keyed_requests(when: timestamp_pb2.Timestamp) -> dict[str, tuple[str, object]]:
    """Every WorkerService request that carries a request_time, well formed but for it."""
    lease, key = some_lease(), str(uuid.uuid4())
    spec = pb.OutputSpec(content_type="image/png", size_bytes=1, sha256="0" * 64)
    common = {"lease": lease, "worker_id": "probe", "request_id": key, "request_time": when}
    return {
        "ClaimJob": (
            "ClaimJob",
            pb.ClaimJobRequest(
                request_id=key,
                claim_token=secrets.token_hex(32),
                worker_id="probe",
                request_time=when,
            ),
        ),
        "PrepareOutputs": ("PrepareOutputs", pb.PrepareOutputsRequest(**common, outputs=[spec])),
        "StartJob": (
            "StartJob",
            pb.StartJobRequest(**common, expected_version=1, step=pb.WORKER_STEP_SUBMITTING),
        ),
        "CompleteJob": (
            "CompleteJob",
            pb.CompleteJobRequest(
                **common, expected_version=1, output_asset_ids=[str(uuid.uuid4())]
            ),
        ),
        "ReleaseJob": ("ReleaseJob", pb.ReleaseJobRequest(**common, expected_version=1)),
        "AcknowledgeCancel": (
            "AcknowledgeCancel",
            pb.AcknowledgeCancelRequest(**common, expected_version=1),
        ),
    }


async def test_a_request_time_from_the_future_is_refused_with_its_window(api: Stack) -> None:
    far = stamp(datetime(9999, 1, 1, tzinfo=UTC))
    async with channel(api) as ch:
        stub = worker_service_pb2_grpc.WorkerServiceStub(ch)
        gpu = pool_metadata("gpu")
        for method, request in keyed_requests(far).values():
            error = await refusal(getattr(stub, method)(request, metadata=gpu))
            assert (error.code(), reason_of(error)) == (INVALID, "INVALID_WORKER_REQUEST"), method
            found = bad_request(error)
            assert found is not None, method
            [violation] = found.field_violations
            assert violation.field == "request_time", method
            # The window: no later than the server's clock plus the skew, as a time.
            assert "no later than" in violation.description, violation.description
            latest = violation.description.rsplit(" ", 1)[-1]
            allowed = datetime.fromisoformat(latest)
            now = datetime.now(UTC)
            assert now < allowed < now + timedelta(minutes=10), violation.description

        # A worker's clock a few seconds ahead is within the skew: the claim is taken
        # (nothing is queued, so it finds nothing).
        near = stamp(datetime.now(UTC) + timedelta(seconds=5))
        _, claim = keyed_requests(near)["ClaimJob"]
        answer = await stub.ClaimJob(claim, metadata=gpu)
        assert not answer.HasField("job")
