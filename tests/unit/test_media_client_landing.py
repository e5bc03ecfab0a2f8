"""How creation reads a failed landing call to media (PutAsset and the output uploads):
only media's own refusal of the output fails the attempt; anything else is media being
unavailable, so the attempt is handed back and polls again instead of submitting to the
provider a second time."""

import grpc
import pytest
from grpc import aio

from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, _refused_or_unavailable
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
