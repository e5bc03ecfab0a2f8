"""creation's MediaClient lands a batch's outputs in one ReserveOutputUploads and one
CompleteOutputUploads (a real grpc.aio server playing media): each caller gets its own
item's answer, mapped as its single call's would be (a refusal is AssetRefused, an
unavailable item MediaUnavailable with media's retry hint); a media without the batched
calls (UNIMPLEMENTED, an older replica mid-rollout) is asked item by item; a batch call
media does not answer fails every caller as MediaUnavailable, with no single calls."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.rpc import status_pb2

from atelier.media.v1 import asset_pb2, media_internal_service_pb2_grpc
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, MediaClient
from services.kit.errors import ApiError


def _status(code: grpc.StatusCode, reason: str, retry: float | None = None) -> status_pb2.Status:
    """An item's status as media's server stack makes it."""
    return ApiError(code, reason, reason, retry_after_seconds=retry).to_status()


class FakeMedia(media_internal_service_pb2_grpc.MediaInternalServiceServicer):
    """Answers by idempotency key: "ok-*" reserved, "refused-*" refused, "busy-*" unavailable."""

    def __init__(self, batched: bool = True, batch_code: grpc.StatusCode | None = None) -> None:
        self.batched = batched
        self.batch_code = batch_code
        self.calls: list[tuple[str, int]] = []

    def _reservation(self, request: pb.ReserveOutputUploadRequest) -> pb.ReserveOutputUploadResult:
        key = request.idempotency_key
        if key.startswith("refused"):
            return pb.ReserveOutputUploadResult(
                error=_status(grpc.StatusCode.INVALID_ARGUMENT, "CONTENT_TYPE_NOT_ALLOWED")
            )
        if key.startswith("busy"):
            return pb.ReserveOutputUploadResult(
                error=_status(grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE", retry=7)
            )
        return pb.ReserveOutputUploadResult(
            reservation=pb.ReserveOutputUploadResponse(
                asset=asset_pb2.Asset(asset_id=f"asset-{key}"),
                upload_url=f"http://objects/{key}",
                upload_method="PUT",
            )
        )

    async def ReserveOutputUploads(
        self, request: pb.ReserveOutputUploadsRequest, context: Any
    ) -> pb.ReserveOutputUploadsResponse:
        self.calls.append(("ReserveOutputUploads", len(request.requests)))
        if not self.batched:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no such method")
        if self.batch_code is not None:
            await context.abort(self.batch_code, "media is down")
        return pb.ReserveOutputUploadsResponse(
            results=[self._reservation(r) for r in request.requests]
        )

    async def ReserveOutputUpload(
        self, request: pb.ReserveOutputUploadRequest, context: Any
    ) -> pb.ReserveOutputUploadResponse:
        self.calls.append(("ReserveOutputUpload", 1))
        result = self._reservation(request)
        if result.HasField("error"):
            await context.abort(_code(result.error.code), result.error.message)
        return result.reservation

    async def CompleteOutputUploads(
        self, request: pb.CompleteOutputUploadsRequest, context: Any
    ) -> pb.CompleteOutputUploadsResponse:
        self.calls.append(("CompleteOutputUploads", len(request.requests)))
        results = []
        for item in request.requests:
            if item.idempotency_key.startswith("refused"):
                results.append(
                    pb.CompleteOutputUploadResult(
                        error=_status(grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_MISSING")
                    )
                )
            else:
                results.append(
                    pb.CompleteOutputUploadResult(asset=asset_pb2.Asset(asset_id=item.asset_id))
                )
        return pb.CompleteOutputUploadsResponse(results=results)


def _code(number: int) -> grpc.StatusCode:
    return next(code for code in grpc.StatusCode if code.value[0] == number)


async def media_with(fake: FakeMedia) -> tuple[grpc.aio.Server, MediaClient]:
    server = grpc.aio.server()
    media_internal_service_pb2_grpc.add_MediaInternalServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, MediaClient(f"127.0.0.1:{port}", "service-token")


async def reserve(client: MediaClient, key: str) -> Any:
    return await client.reserve_output("alice", "image/png", 10, "0" * 64, key)


async def test_each_caller_gets_its_own_items_answer_from_one_call() -> None:
    fake = FakeMedia()
    server, client = await media_with(fake)
    try:
        ok, refused, busy = await asyncio.gather(
            reserve(client, "ok-1"),
            reserve(client, "refused-1"),
            reserve(client, "busy-1"),
            return_exceptions=True,
        )
        assert ok.asset_id == "asset-ok-1" and ok.url == "http://objects/ok-1"
        assert isinstance(refused, AssetRefused)
        assert "CONTENT_TYPE_NOT_ALLOWED" in str(refused)
        assert isinstance(busy, MediaUnavailable)
        assert (busy.cause, busy.retry_after_seconds) == ("DATABASE_UNAVAILABLE", 7.0)
        assert fake.calls == [("ReserveOutputUploads", 3)]

        committed, missing = await asyncio.gather(
            client.complete_output("alice", "asset-ok-1", "ok-1"),
            client.complete_output("alice", "asset-x", "refused-2"),
            return_exceptions=True,
        )
        assert committed == "asset-ok-1"
        assert isinstance(missing, AssetRefused) and "OBJECT_MISSING" in str(missing)
        assert fake.calls[1:] == [("CompleteOutputUploads", 2)]
    finally:
        await client.close()
        await server.stop(None)


async def test_a_media_without_the_batched_call_is_asked_item_by_item() -> None:
    fake = FakeMedia(batched=False)
    server, client = await media_with(fake)
    try:
        ok, refused = await asyncio.gather(
            reserve(client, "ok-1"), reserve(client, "refused-1"), return_exceptions=True
        )
        assert ok.asset_id == "asset-ok-1"
        assert isinstance(refused, AssetRefused)
        assert fake.calls[0] == ("ReserveOutputUploads", 2)
        assert sorted(fake.calls[1:]) == [("ReserveOutputUpload", 1)] * 2
    finally:
        await client.close()
        await server.stop(None)


async def test_a_batch_media_does_not_answer_fails_every_caller_as_unavailable() -> None:
    fake = FakeMedia(batch_code=grpc.StatusCode.UNAVAILABLE)
    server, client = await media_with(fake)
    try:
        answers = await asyncio.gather(
            reserve(client, "ok-1"), reserve(client, "ok-2"), return_exceptions=True
        )
        assert all(isinstance(answer, MediaUnavailable) for answer in answers)
        # UNAVAILABLE is retried by the channel's policy (the call is idempotent), never
        # sent item by item.
        assert {name for name, _ in fake.calls} == {"ReserveOutputUploads"}
    finally:
        await client.close()
        await server.stop(None)
