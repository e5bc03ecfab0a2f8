"""Helpers for reading rich gRPC errors in tests."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def error_info(error: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "the error carries no google.rpc.Status"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("the status has no ErrorInfo")


def bad_request(error: grpc.aio.AioRpcError) -> error_details_pb2.BadRequest | None:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            found = error_details_pb2.BadRequest()
            detail.Unpack(found)
            return found
    return None


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def retry_delay(error: grpc.aio.AioRpcError | grpc.RpcError) -> float | None:
    """The RetryInfo delay in seconds, or None when the status carries no RetryInfo."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            found = error_details_pb2.RetryInfo()
            detail.Unpack(found)
            return found.retry_delay.seconds + found.retry_delay.nanos / 1e9
    return None
