"""A change is serialized once for all the streams that send it, and the bytes are the
very messages the contract names; the stack's serializer sends such bytes as they are."""

from __future__ import annotations

from typing import Any

import grpc

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.interceptors import wrap_handler
from services.notify.streams.change import Change

STATE = job_pb2.Job(
    job_id="3f2504e0-4f89-41d3-9a0c-0305e82c3301",
    user_id="user-1",
    version=4,
    status=job_pb2.JOB_STATUS_RUNNING,
    progress_percent=40,
)


def test_the_watch_job_bytes_are_the_response_and_made_once() -> None:
    change = Change.of(STATE, seq=9, terminal=False)
    first = change.job_response()
    assert pb.WatchJobResponse.FromString(first) == pb.WatchJobResponse(job=STATE)
    assert change.job_response() is first


def test_the_watch_jobs_bytes_carry_the_state_and_each_streams_own_cursor() -> None:
    change = Change.of(STATE, seq=9, terminal=False)
    for cursor in ("s9", "s12"):
        sent = pb.WatchJobsResponse.FromString(change.jobs_response(cursor))
        assert sent == pb.WatchJobsResponse(job=STATE, cursor=cursor)
    assert change.jobs_response("") == pb.WatchJobsResponse(job=STATE).SerializeToString()


async def _around(context: Any, call: Any) -> None:
    await call()


def test_a_streaming_handler_may_yield_serialized_bytes() -> None:
    async def stream(request: Any, context: Any) -> Any:
        yield pb.WatchJobResponse()

    handler = grpc.unary_stream_rpc_method_handler(
        stream,
        request_deserializer=pb.WatchJobRequest.FromString,
        response_serializer=pb.WatchJobResponse.SerializeToString,
    )
    serialize = wrap_handler(handler, _around).response_serializer
    assert serialize is not None
    message = pb.WatchJobResponse(job=STATE)
    assert serialize(message) == message.SerializeToString()
    assert serialize(b"already serialized") == b"already serialized"
    # Wrapped again (an outer layer of the stack), the serializer stays the same one.
    again = wrap_handler(wrap_handler(handler, _around), _around).response_serializer
    assert again is not None and again(b"x") == b"x"


def test_a_unary_handler_keeps_its_own_serializer() -> None:
    async def unary(request: Any, context: Any) -> Any:
        return pb.WatchJobResponse()

    handler = grpc.unary_unary_rpc_method_handler(
        unary,
        request_deserializer=pb.WatchJobRequest.FromString,
        response_serializer=pb.WatchJobResponse.SerializeToString,
    )
    assert (
        wrap_handler(handler, _around).response_serializer == pb.WatchJobResponse.SerializeToString
    )
