"""How creation reads a failed landing call to media (PutAsset and the output uploads):
only media's own refusal of the output fails the attempt; anything else is media being
unavailable (a CancelledError gRPC raises with nobody cancelling included), so the
attempt is handed back and polls again instead of submitting to the provider a second
time."""

import asyncio

import grpc
import pytest
from grpc import aio

from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, MediaClient, _refused_or_unavailable
from services.kit.errors import ApiError


def failed_call(code: grpc.StatusCode, reason: str | None = None) -> aio.AioRpcError:
    trailing = aio.Metadata()
    if reason is not None:
        # As one of our services sends it: a google.rpc.Status with its ErrorInfo.
        status = ApiError(code, reason, "media says no").to_status()
        trailing = aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return aio.AioRpcError(code, aio.Metadata(), trailing, details="media says no")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "CONTENT_REJECTED"),
        (grpc.StatusCode.INVALID_ARGUMENT, "UPLOAD_TOO_LARGE"),
        (grpc.StatusCode.FAILED_PRECONDITION, "ASSET_DELETED"),
        (grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED"),
        (grpc.StatusCode.NOT_FOUND, "ASSET_NOT_FOUND"),
    ],
)
def test_medias_refusal_of_the_output_fails_the_attempt(code: grpc.StatusCode, reason: str) -> None:
    failure = _refused_or_unavailable("PutAsset", failed_call(code, reason))
    assert isinstance(failure, AssetRefused)
    assert str(failure) == f"{code.name} {reason}"


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        # What gRPC itself has been seen to report for a call in flight to a replica
        # killed with SIGKILL ("Internal error from Core"), with no status details.
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        # A credential media no longer takes: an operator's fix, not the output's fault.
        grpc.StatusCode.UNAUTHENTICATED,
    ],
)
def test_anything_else_is_media_unavailable(code: grpc.StatusCode) -> None:
    failure = _refused_or_unavailable("PutAsset", failed_call(code))
    assert isinstance(failure, MediaUnavailable)


class _PutAssetStub:
    """Stands in for media's stub: PutAsset raises what ``outcome`` says, or hangs."""

    def __init__(self, outcome: BaseException | None) -> None:
        self._outcome = outcome
        self.started = asyncio.Event()

    async def PutAsset(self, parts: object, **options: object) -> object:
        self.started.set()
        if self._outcome is not None:
            raise self._outcome
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def client_with(stub: _PutAssetStub) -> MediaClient:
    client = MediaClient("127.0.0.1:1", "service-token-for-a-unit-test-only-000")
    client._stub_instance = stub  # type: ignore[assignment]
    return client


async def test_a_cancelled_error_grpc_raised_by_itself_is_media_unavailable() -> None:
    client = client_with(_PutAssetStub(asyncio.CancelledError()))
    try:
        with pytest.raises(MediaUnavailable):
            await client.put_asset("user-1", "ai_output", "image/png", b"png", idempotency_key="k")
    finally:
        await client.close()


async def test_a_real_cancellation_of_the_landing_still_cancels() -> None:
    stub = _PutAssetStub(None)
    client = client_with(stub)
    landing = asyncio.create_task(
        client.put_asset("user-1", "ai_output", "image/png", b"png", idempotency_key="k")
    )
    await stub.started.wait()
    landing.cancel()
    try:
        with pytest.raises(asyncio.CancelledError):
            await landing
    finally:
        await client.close()
